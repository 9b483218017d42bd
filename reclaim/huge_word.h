/* The one-word name of a freed huge mapping, shared by the cache
 * (reclaim/huge_cache.h) and the queue (reclaim/huge_queue.h): state in
 * bits 0-2, accounting node in 3-5, the block's size in pages in 6-39 (2^34
 * pages: LULL_MAX_ALLOC), the header address >> 25 in 40-63 (headers are
 * 32 MiB aligned; addresses below 2^49). The whole entry in one word is
 * what lets a request thread judge the fit and claim it in one step, and
 * the statistics count it, without reading a header the reclaim thread may
 * be unmapping. And the fit rule every reuse of a freed mapping follows. */
#ifndef LULL_HUGE_WORD_H
#define LULL_HUGE_WORD_H

#include "base/types.h"

enum {
    LULL_HC_EMPTY = 0,
    LULL_HC_DIRTY,   /* freed, maybe resident: contents not zero */
    LULL_HC_PURGING, /* the reclaim thread is purging it: never handed out */
    LULL_HC_CLEAN,   /* purged with MADV_DONTNEED: the block reads as zero */
    LULL_HC_LAZY,    /* purged with MADV_FREE: not known to be zero */
};

#define LULL_HW_STATE_MASK UINT64_C(7)
#define LULL_HW_NODE_SHIFT 3
#define LULL_HW_PAGES_SHIFT 6
#define LULL_HW_PAGES_BITS 34
#define LULL_HW_ADDR_SHIFT 40
#define LULL_HW_ADDR_LIMIT ((uintptr_t)1 << (LULL_SEGMENT_SHIFT + 64 - LULL_HW_ADDR_SHIFT))

_Static_assert(LULL_MAX_NODES <= 8, "the node must fit in 3 bits");
_Static_assert(LULL_MAX_ALLOC / LULL_PAGE_SIZE <= (UINT64_C(1) << LULL_HW_PAGES_BITS),
               "the block size in pages must fit in its bits");
_Static_assert(LULL_HW_PAGES_SHIFT + LULL_HW_PAGES_BITS == LULL_HW_ADDR_SHIFT, "fields touch");

/* One slot as read at one moment. `h` must not be dereferenced unless a
 * claim of this entry succeeded. */
typedef struct lull_huge_cache_entry {
    uint64_t word;
    lull_huge *h;
    size_t usable;     /* the block's bytes (h->usable) */
    int node;          /* accounting node of the mapping */
    int state;         /* LULL_HC_* */
    uint32_t freed_ms; /* when it was cached (lull_now_ms; the cache's slots only) */
    uint32_t gap_ms;   /* its mapping's reuse_gap_ms then (the cache's slots only) */
} lull_huge_cache_entry;

/* How long past its free a DIRTY cached mapping is kept from its purge,
 * whatever the purge delay: twice the time it waited in the cache before
 * its last reuse, plus LULL_HUGE_HOLD_SLACK_MS, if that was at most
 * LULL_HUGE_HOLD_GAP_MAX_MS; else 0 (the delay alone, as for a mapping
 * never reused). A server's request buffer comes back every request; the
 * adaptive delay, driven short by span churn, purged it (MADV_FREE) between
 * requests, and each request wrote every page dirty again: bench/buffer_cycle
 * 4.7 ms a request where it takes 1.9-2.2 held (tcmalloc 2.0-2.2), and no
 * lower RSS (MADV_FREE'd pages stay in it). Held mappings are bounded in
 * bytes by the reclaim thread (reclaim/huge_reclaim.c). */
#define LULL_HUGE_HOLD_GAP_MAX_MS 500u
#define LULL_HUGE_HOLD_SLACK_MS 20u

static inline uint32_t lull_huge_hold_ms(uint32_t gap_ms) {
    return gap_ms <= LULL_HUGE_HOLD_GAP_MAX_MS ? 2 * gap_ms + LULL_HUGE_HOLD_SLACK_MS : 0;
}

static inline int lull_huge_node_of(const lull_huge *h) {
    return h->node >= 0 && h->node < LULL_MAX_NODES ? h->node : 0;
}

/* Whether a word can name this mapping at all (the cache's bound aside). */
static inline bool lull_huge_word_accepts(const lull_huge *h) {
    return h->block_offset == LULL_SLICE_SIZE && (uintptr_t)h < LULL_HW_ADDR_LIMIT &&
           h->usable % LULL_PAGE_SIZE == 0 &&
           h->usable / LULL_PAGE_SIZE < (UINT64_C(1) << LULL_HW_PAGES_BITS);
}

/* The word of an accepted mapping, with its state. */
static inline uint64_t lull_huge_word(const lull_huge *h, int state) {
    return (uint64_t)state | (uint64_t)lull_huge_node_of(h) << LULL_HW_NODE_SHIFT |
           (uint64_t)(h->usable / LULL_PAGE_SIZE) << LULL_HW_PAGES_SHIFT |
           (uint64_t)((uintptr_t)h >> LULL_SEGMENT_SHIFT) << LULL_HW_ADDR_SHIFT;
}

static inline void lull_huge_word_decode(uint64_t w, lull_huge_cache_entry *e) {
    e->word = w;
    e->state = (int)(w & LULL_HW_STATE_MASK);
    e->node = (int)(w >> LULL_HW_NODE_SHIFT & 7);
    e->usable = (size_t)(w >> LULL_HW_PAGES_SHIFT & ((UINT64_C(1) << LULL_HW_PAGES_BITS) - 1)) *
                LULL_PAGE_SIZE;
    e->h = (lull_huge *)(uintptr_t)((w >> LULL_HW_ADDR_SHIFT) << LULL_SEGMENT_SHIFT);
}

static inline uint64_t lull_huge_word_with_state(uint64_t w, int state) {
    return (w & ~LULL_HW_STATE_MASK) | (uint64_t)state;
}

/* The fit rule of every reuse of a freed mapping (cache and queue): room
 * for `size`, and at most an eighth of it left over (the size classes'
 * bound on waste). The room beyond the size of a DIRTY mapping is resident
 * until the block is freed and purged: with half left over allowed (and,
 * while fresh mappings had 32 MiB of alignment slack in their room, that
 * slack too), a program replacing 20-64 MiB blocks at random reused
 * mappings up to twice the size it asked for, and its peak RSS was 1.5
 * times glibc's. A fresh mapping's room is its size rounded up to a
 * granule of at most 1/32 of it (huge.c, huge_room_for), so a mapping made
 * for a size always fits that size again. */
static inline bool lull_huge_fits(size_t room, size_t size) {
    if (room < size) return false;
    size_t pages = LULL_PAGES_OF(size);
    return room - pages <= pages / 8;
}

#endif
