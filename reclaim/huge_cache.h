/* Freed huge mappings kept for reuse, owned by the reclaim thread.
 *
 * free() of a huge block puts its mapping into a free slot (still dirty);
 * a later huge malloc of a size that fits takes it back: no mmap, and no
 * page faults while it is still dirty. A mapping freed while the cache is
 * full (or off) goes to the queue (reclaim/huge_queue.h), from which a
 * huge malloc that misses here takes it back the same way. The reclaim
 * thread purges cached mappings once they have been free for the purge
 * delay, and unmaps them when they stay unused for huge_cache_idle_ms, when
 * the cache holds more than huge_cache_mb, or to make room for a queued
 * mapping (reclaim/huge_reclaim.c).
 *
 * Each slot is one atomic word that names the mapping (header address,
 * node, block size, state), so every move is one compare-and-swap on it and
 * exactly one side wins: a request thread takes a DIRTY, CLEAN or LAZY
 * entry by swapping in 0; the reclaim thread claims one by swapping in
 * PURGING (which no request thread takes), then purges it and sets its new
 * state, or empties the slot to unmap it. A header is read only by whoever
 * owns the mapping; the word alone says whether an entry fits, so nothing
 * reads a mapping another thread may be unmapping, and the statistics read
 * the words only. No lock, so a request thread never waits for the reclaim
 * thread nor makes a system call here. */
#ifndef LULL_HUGE_CACHE_H
#define LULL_HUGE_CACHE_H

#include "src/types.h"

#define LULL_HUGE_CACHE_SLOTS 64

enum {
    LULL_HC_EMPTY = 0,
    LULL_HC_DIRTY,   /* freed, maybe resident: contents not zero */
    LULL_HC_PURGING, /* the reclaim thread is purging it: never handed out */
    LULL_HC_CLEAN,   /* purged with MADV_DONTNEED: the block reads as zero */
    LULL_HC_LAZY,    /* purged with MADV_FREE: not known to be zero */
};

/* One slot as read at one moment. `h` must not be dereferenced unless a
 * claim below succeeded with this entry. */
typedef struct lull_huge_cache_entry {
    uint64_t word;
    lull_huge *h;
    size_t usable;     /* the block's bytes (h->usable) */
    int node;          /* accounting node of the mapping */
    int state;         /* LULL_HC_* */
    uint32_t freed_ms; /* when it was cached (lull_now_ms) */
} lull_huge_cache_entry;

/* The fit rule of every reuse of a freed mapping (cache and queue): room
 * for `size`, and no more room left over than half the block or than a
 * fresh mapping of that size could have (a fresh one maps 32 MiB more than
 * it needs, to align its header, so its room is anywhere from the size to
 * the size + 32 MiB: with half as the only rule, about a third of the
 * mappings made for a 20 MiB block were refused to the next 20 MiB block,
 * sat in the cache and filled it, and every huge malloc then mapped anew).
 * The room beyond the size is address space; a DIRTY mapping may have
 * resident pages there (up to 32 MiB) until it is freed and purged. */
static inline bool lull_huge_fits(size_t room, size_t size) {
    if (room < size) return false;
    size_t pages = (size + LULL_PAGE_SIZE - 1) & ~(size_t)(LULL_PAGE_SIZE - 1);
    return room / 2 <= size || room - pages <= LULL_SEGMENT_SIZE;
}

/* The word that names a freed mapping in a slot, here and in the queue
 * (reclaim/huge_queue.h), with its state; h must be lull_huge_cache_accepts
 * (the word has no room for other shapes). And the fields of a word (the
 * queue's slots use word, h, usable and node). */
uint64_t lull_huge_word(const lull_huge *h, int state);
void lull_huge_word_decode(uint64_t w, lull_huge_cache_entry *e);

/* ---- any thread ---------------------------------------------------------- */

/* Cache a freed huge block (accounted as `freed`) with its block one slice
 * after the header. False: not cached (full, over the bound, or a shape the
 * cache does not keep); the caller queues it for unmapping. */
bool lull_huge_cache_put(lull_huge *h, uint32_t now_ms);
/* The best fitting cached mapping of `node` for `size` (lull_huge_fits),
 * accounted as `freed` again; when the cache has none, a queued one that
 * fits (lull_huge_queue_take: one the cache would keep, or any while the
 * queue is backlogged), accounted as `freed` all along; or NULL. *zeroed
 * tells whether its block reads as zero. No system call, no lock. */
lull_huge *lull_huge_cache_take(size_t size, int node, bool *zeroed);
/* Address space of the cached mappings (what huge_cache_mb bounds). */
uint64_t lull_huge_cache_bytes(void);
/* Add the cached mappings to per-node terms: dirty, purging, purged (the
 * block) and metadata (the header slice); bytes[] gets both. */
void lull_huge_cache_account(uint64_t dirty[LULL_MAX_NODES], uint64_t purging[LULL_MAX_NODES],
                             uint64_t purged[LULL_MAX_NODES], uint64_t metadata[LULL_MAX_NODES],
                             uint64_t bytes[LULL_MAX_NODES]);

/* ---- the reclaim thread ---------------------------------------------------- */

/* Read slot i; false if it is empty. */
bool lull_huge_cache_peek(unsigned i, lull_huge_cache_entry *e);
/* DIRTY or LAZY -> PURGING, if slot i still holds e and (DIRTY) it was
 * cached at or before freed_before_ms. */
bool lull_huge_cache_claim_purge(unsigned i, const lull_huge_cache_entry *e,
                                 uint32_t freed_before_ms);
/* PURGING -> state (CLEAN, LAZY, or DIRTY again when the purge failed). */
void lull_huge_cache_finish_purge(unsigned i, const lull_huge_cache_entry *e, int state);
/* Take e out of slot i to unmap it (not while PURGING), if it was cached at
 * or before freed_before_ms: on success the mapping is the caller's,
 * accounted as `freed`. */
bool lull_huge_cache_evict(unsigned i, const lull_huge_cache_entry *e, uint32_t freed_before_ms);
/* Whether the cache keeps mappings of this shape at all (bound aside). */
bool lull_huge_cache_accepts(const lull_huge *h);

/* In the child after fork: a purge the parent's reclaim thread was running
 * is not running here, so PURGING entries are DIRTY again; the byte count is
 * taken again from the slots (a put or take other threads had half done is
 * not the child's), and the queue's too (lull_huge_queue_after_fork_child). */
void lull_huge_cache_after_fork_child(void);

#endif
