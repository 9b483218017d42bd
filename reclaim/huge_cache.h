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

#include "reclaim/huge_word.h"
#include "base/types.h"

#define LULL_HUGE_CACHE_SLOTS 64

/* ---- any thread ---------------------------------------------------------- */

/* Cache a freed huge block (accounted as `freed`) with its block one slice
 * after the header. False: not cached (full, over the bound, or a shape the
 * cache does not keep); the caller queues it for unmapping. */
bool lull_huge_cache_put(lull_huge *h, uint32_t now_ms);
/* The best fitting cached mapping of `node` for `size` (lull_huge_fits),
 * accounted as `freed` again (a purged one only if the heap limit leaves
 * room for its block, which joins the resident estimate); when the cache
 * has none, a queued one that fits (lull_huge_queue_take: one the cache
 * would keep, or any while the queue is backlogged), accounted as `freed`
 * all along; or NULL. *zeroed tells whether its block reads as zero. No
 * system call, no lock. */
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
/* DIRTY -> PURGING, whatever its age, if slot i still holds e and a huge
 * malloc found no mapping that fits since e was cached: the sizes asked for
 * moved on, and it is purged at once instead of after the purge delay.
 * Mapped anew beside cached mappings it passed over, a program replacing
 * 20-64 MiB blocks at random had a peak RSS 1.5 times glibc's. */
bool lull_huge_cache_claim_passed_over(unsigned i, const lull_huge_cache_entry *e);
/* PURGING -> state (CLEAN, LAZY, or DIRTY again when the purge failed). */
void lull_huge_cache_finish_purge(unsigned i, const lull_huge_cache_entry *e, int state);
/* Take e out of slot i to unmap it (not while PURGING), if it was cached at
 * or before freed_before_ms: on success the mapping is the caller's,
 * accounted as `freed`. */
bool lull_huge_cache_evict(unsigned i, const lull_huge_cache_entry *e, uint32_t freed_before_ms);
/* The same, whatever its age (lull_purge_all). */
bool lull_huge_cache_evict_any(unsigned i, const lull_huge_cache_entry *e);
/* Whether the block of an entry in `state` counts in the resident estimate
 * (base/resident.h): DIRTY ones do, purged ones (CLEAN, LAZY) do not; the
 * header slice always does. Its unmap says so (lull_huge_unmap). */
bool lull_huge_cache_block_resident(int state);

/* In the child after fork: a purge the parent's reclaim thread was running
 * is not running here, so PURGING entries are DIRTY again; the byte count is
 * taken again from the slots (a put or take other threads had half done is
 * not the child's), and the queue's too (lull_huge_queue_after_fork_child). */
void lull_huge_cache_after_fork_child(void);

#endif
