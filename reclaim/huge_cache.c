/* The cache of freed huge mappings; see huge_cache.h. */
#include "reclaim/huge_cache.h"
#include "reclaim/huge_queue.h"
#include "base/config.h"
#include "base/resident.h"
#include "numa/arena.h"
#include "numa/huge.h"
#include "base/fork_exec.h"

#include <stdatomic.h>

static _Atomic uint64_t slots[LULL_HUGE_CACHE_SLOTS];
/* When each entry was cached. Written by the putter before it fills the
 * slot (it does not own the slot yet, so a racing putter may write too: the
 * time is then a little later, never earlier, than the entry's); the
 * reclaim thread reads it after it has seen the word. */
static _Atomic uint32_t freed_ms[LULL_HUGE_CACHE_SLOTS];
/* Each entry's reuse gap (h->reuse_gap_ms when it was cached), written and
 * read as freed_ms: the reclaim thread reads no header it does not own. */
static _Atomic uint32_t gap_ms[LULL_HUGE_CACHE_SLOTS];
/* Huge mallocs that found no mapping that fits, and their count when each
 * entry was cached (written with freed_ms, read the same way): an entry
 * that a later malloc passed over is not what mallocs ask for now. */
static _Atomic uint32_t misses;
static _Atomic uint32_t misses_at_put[LULL_HUGE_CACHE_SLOTS];
/* map_len of the cached mappings: reserved before an entry goes in,
 * released after it came out, so it is never below what the slots hold:
 * 0 in a fork child, and the child reads no slot (base/fork_exec.h). */
static LULL_FORK_EXEC_DATA _Atomic uint64_t cached_bytes;

/* A freed block moves between `freed` (huge.c's terms) and the cache's own
 * words. Into the cache: out of `freed` first; out of the cache: into
 * `freed` after. An entry in transit is then in no term, never in two: in
 * a child forked meanwhile it is a mapping nobody holds, and not counted. */
static void account_freed(const lull_huge *h, bool add) {
    lull_huge_accounting *a = &lull_huge_acct[lull_huge_node_of(h)];
    uint64_t v = h->usable + LULL_HUGE_HEADER_BYTES;
    if (add)
        atomic_fetch_add_explicit(&a->freed, v, memory_order_relaxed);
    else
        atomic_fetch_sub_explicit(&a->freed, v, memory_order_relaxed);
}

bool lull_huge_cache_put(lull_huge *h, uint32_t now_ms) {
    if (!lull_huge_word_accepts(h)) return false;
    uint64_t bound = __atomic_load_n(&lull_config.huge_cache_bytes, __ATOMIC_RELAXED);
    uint64_t len = h->map_len;
    if (len > bound) return false;
    if (atomic_fetch_add_explicit(&cached_bytes, len, memory_order_relaxed) + len > bound) {
        atomic_fetch_sub_explicit(&cached_bytes, len, memory_order_relaxed);
        return false;
    }
    uint64_t w = lull_huge_word(h, LULL_HC_DIRTY);
    account_freed(h, false);
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        uint64_t expected = atomic_load_explicit(&slots[i], memory_order_relaxed);
        if (expected) continue;
        atomic_store_explicit(&freed_ms[i], now_ms, memory_order_relaxed);
        atomic_store_explicit(&gap_ms[i], h->reuse_gap_ms, memory_order_relaxed);
        atomic_store_explicit(&misses_at_put[i], atomic_load(&misses), memory_order_relaxed);
        if (atomic_compare_exchange_strong_explicit(&slots[i], &expected, w, memory_order_release,
                                                    memory_order_relaxed))
            return true;
    }
    account_freed(h, true);
    atomic_fetch_sub_explicit(&cached_bytes, len, memory_order_relaxed);
    return false;
}

static bool takeable(int state) {
    return state == LULL_HC_DIRTY || state == LULL_HC_CLEAN || state == LULL_HC_LAZY;
}

/* Whether an entry's block counts in the resident estimate (base/resident.h):
 * a purged one (CLEAN, or LAZY: the kernel takes it when it needs it) does
 * not, and joins it again when a malloc takes it back. A PURGING entry
 * counts as the state it was claimed from. The header slice always counts. */
static bool block_resident(int state) {
    return state == LULL_HC_DIRTY;
}

static lull_huge *take_cached(size_t size, int node, bool *zeroed) {
    if (!atomic_load_explicit(&cached_bytes, memory_order_relaxed)) return NULL;
    /* a lost race means another thread took that entry: look again, a
     * few times, for the next best */
    for (int attempt = 0; attempt < 4; attempt++) {
        lull_huge_cache_entry best = {0}, e;
        unsigned best_slot = 0;
        for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
            uint64_t w = atomic_load_explicit(&slots[i], memory_order_relaxed);
            if (!w) continue;
            lull_huge_word_decode(w, &e);
            if (!takeable(e.state) || e.node != node || !lull_huge_fits(e.usable, size)) continue;
            /* a purged block is resident again once used: not past the limit */
            if (!block_resident(e.state) && lull_resident_room() < e.usable) continue;
            /* the tightest fit; among equals a dirty one (resident: no faults) */
            if (!best.word || e.usable < best.usable ||
                (e.usable == best.usable && e.state == LULL_HC_DIRTY)) {
                best = e;
                best_slot = i;
            }
        }
        if (!best.word) return NULL;
        /* grown before the entry is ours, given back if another thread wins it */
        bool grown = !block_resident(best.state);
        if (grown && !lull_resident_try_grow(best.usable)) continue;
        uint64_t expected = best.word;
        if (!atomic_compare_exchange_strong_explicit(&slots[best_slot], &expected, 0,
                                                     memory_order_acquire, memory_order_relaxed)) {
            if (grown) lull_resident_sub(best.usable);
            continue;
        }
        lull_huge *h = best.h;
        /* ours now: how long it waited (a racing putter may have written a
         * later time into the slot: the gap is then shorter) */
        h->reuse_gap_ms =
            lull_now_ms() - atomic_load_explicit(&freed_ms[best_slot], memory_order_relaxed);
        *zeroed = best.state == LULL_HC_CLEAN;
        atomic_fetch_sub_explicit(&cached_bytes, h->map_len, memory_order_relaxed);
        account_freed(h, true);
        return h;
    }
    return NULL;
}

lull_huge *lull_huge_cache_take(size_t size, int node, bool *zeroed) {
    lull_huge *h = take_cached(size, node, zeroed);
    if (h) return h;
    /* a mapping freed while the cache was full (or off) and not yet given
     * back: as good as cached when the cache would keep it, and taken
     * anyway while the queue is backlogged (huge_queue.h) */
    h = lull_huge_queue_take(size, node,
                             __atomic_load_n(&lull_config.huge_cache_bytes, __ATOMIC_RELAXED));
    if (h) {
        *zeroed = false; /* never purged: the reclaim thread purges only what it owns */
        h->reuse_gap_ms = LULL_HUGE_NO_GAP; /* the queue keeps no time */
    }
    if (!h) atomic_fetch_add_explicit(&misses, 1, memory_order_relaxed);
    return h;
}

uint64_t lull_huge_cache_bytes(void) {
    return atomic_load_explicit(&cached_bytes, memory_order_relaxed);
}

void lull_huge_cache_account(uint64_t dirty[LULL_MAX_NODES], uint64_t purging[LULL_MAX_NODES],
                             uint64_t purged[LULL_MAX_NODES], uint64_t metadata[LULL_MAX_NODES],
                             uint64_t bytes[LULL_MAX_NODES]) {
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        uint64_t w = atomic_load_explicit(&slots[i], memory_order_relaxed);
        if (!w) continue;
        lull_huge_cache_entry e;
        lull_huge_word_decode(w, &e);
        uint64_t *term = e.state == LULL_HC_DIRTY     ? dirty
                         : e.state == LULL_HC_PURGING ? purging
                                                      : purged;
        term[e.node] += e.usable;
        metadata[e.node] += LULL_HUGE_HEADER_BYTES; /* the header slice: block_offset */
        bytes[e.node] += e.usable + LULL_HUGE_HEADER_BYTES;
    }
}

bool lull_huge_cache_peek(unsigned i, lull_huge_cache_entry *e) {
    uint64_t w = atomic_load_explicit(&slots[i], memory_order_acquire);
    if (!w) return false;
    lull_huge_word_decode(w, e);
    e->freed_ms = atomic_load_explicit(&freed_ms[i], memory_order_relaxed);
    e->gap_ms = atomic_load_explicit(&gap_ms[i], memory_order_relaxed);
    return true;
}

/* Hold entry i (as read into e) by swapping in PURGING, which no malloc
 * takes. The same mapping may have been taken and freed again since `e` was
 * read (same word, new time): the time, written before it went in, is
 * checked while the slot is held (if check_time), and an entry that turns
 * out too young is put back without a race. */
static bool hold_if_old(unsigned i, const lull_huge_cache_entry *e, uint32_t freed_before_ms,
                        bool check_time) {
    uint64_t expected = e->word;
    if (!atomic_compare_exchange_strong_explicit(
            &slots[i], &expected, lull_huge_word_with_state(e->word, LULL_HC_PURGING),
            memory_order_acquire, memory_order_relaxed))
        return false;
    uint32_t t = atomic_load_explicit(&freed_ms[i], memory_order_relaxed);
    if (check_time && (int32_t)(freed_before_ms - t) < 0) {
        atomic_store_explicit(&slots[i], e->word, memory_order_release);
        return false;
    }
    return true;
}

bool lull_huge_cache_claim_purge(unsigned i, const lull_huge_cache_entry *e,
                                 uint32_t freed_before_ms) {
    if (e->state != LULL_HC_DIRTY && e->state != LULL_HC_LAZY) return false;
    /* a DIRTY entry's purge waits for its age; a LAZY one is re-purged
     * when the caller decides */
    return hold_if_old(i, e, freed_before_ms, e->state == LULL_HC_DIRTY);
}

bool lull_huge_cache_claim_passed_over(unsigned i, const lull_huge_cache_entry *e) {
    uint32_t now = atomic_load_explicit(&misses, memory_order_relaxed);
    if (e->state != LULL_HC_DIRTY ||
        atomic_load_explicit(&misses_at_put[i], memory_order_relaxed) == now)
        return false;
    if (!hold_if_old(i, e, 0, false)) return false;
    /* held: the count is the entry's own now (a putter of the same word,
     * freed again, wrote a new count before it filled the slot) */
    if (atomic_load_explicit(&misses_at_put[i], memory_order_relaxed) != now) return true;
    atomic_store_explicit(&slots[i], e->word, memory_order_release);
    return false;
}

void lull_huge_cache_finish_purge(unsigned i, const lull_huge_cache_entry *e, int state) {
    /* e->state is what it was claimed from: DIRTY or LAZY */
    bool was = block_resident(e->state), now = block_resident(state);
    if (now && !was) lull_resident_add(e->usable);
    atomic_store_explicit(&slots[i], lull_huge_word_with_state(e->word, state),
                          memory_order_release);
    if (was && !now) lull_resident_sub(e->usable);
}

static bool evict(unsigned i, const lull_huge_cache_entry *e, uint32_t freed_before_ms,
                  bool any_age) {
    if (e->state == LULL_HC_PURGING) return false;
    if (!hold_if_old(i, e, freed_before_ms, !any_age)) return false;
    atomic_store_explicit(&slots[i], 0, memory_order_release);
    atomic_fetch_sub_explicit(&cached_bytes, e->h->map_len, memory_order_relaxed);
    account_freed(e->h, true);
    return true;
}

bool lull_huge_cache_evict(unsigned i, const lull_huge_cache_entry *e, uint32_t freed_before_ms) {
    return evict(i, e, freed_before_ms, false);
}

bool lull_huge_cache_evict_any(unsigned i, const lull_huge_cache_entry *e) {
    return evict(i, e, 0, true);
}

bool lull_huge_cache_block_resident(int state) {
    return block_resident(state);
}

LULL_FORK_EXEC_TEXT void lull_huge_cache_after_fork_child(void) {
    lull_huge_queue_after_fork_child();
    if (!atomic_load_explicit(&cached_bytes, memory_order_relaxed)) return; /* nothing cached */
    uint64_t bytes = 0;
    for (unsigned i = 0; i < LULL_HUGE_CACHE_SLOTS; i++) {
        uint64_t w = atomic_load_explicit(&slots[i], memory_order_relaxed);
        if (!w) continue;
        if ((w & LULL_HW_STATE_MASK) == LULL_HC_PURGING)
            atomic_store_explicit(&slots[i], lull_huge_word_with_state(w, LULL_HC_DIRTY),
                                  memory_order_relaxed);
        lull_huge_cache_entry e;
        lull_huge_word_decode(w, &e);
        bytes += e.h->map_len; /* one thread here: nobody unmaps it meanwhile */
    }
    atomic_store_explicit(&cached_bytes, bytes, memory_order_relaxed);
}
