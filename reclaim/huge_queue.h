/* Freed huge mappings waiting for the reclaim thread: the ones freed while
 * its cache was full or off (huge_cache_mb=0, or larger than the bound),
 * and every one while no reclaim thread runs.
 *
 * LULL_HUGE_QUEUE_SLOTS one-word slots in the word format
 * (reclaim/huge_word.h, shared with the cache), plus an overflow stack for a mapping no word can
 * name or that finds every slot taken. A huge malloc that misses the cache
 * takes a fitting queued mapping back from a slot without a system call;
 * the reclaim thread drains the overflow, then the slots oldest first,
 * caching what its cache keeps and purging and unmapping the rest. Taking
 * a slot is one compare-and-swap of its word to 0, for a malloc and for the
 * reclaim thread alike: exactly one side wins, and only the winner ever
 * reads the mapping's header. States and transitions: huge_queue.c. */
#ifndef LULL_HUGE_QUEUE_H
#define LULL_HUGE_QUEUE_H

#include "base/types.h"

#define LULL_HUGE_QUEUE_SLOTS 128
/* Queued address space over which a huge malloc takes a queued mapping
 * that the cache would not keep (huge_cache_mb=0, or a mapping over the
 * bound): below it, such mappings are the reclaim thread's to unmap, as
 * configured; above it, the reclaim thread has fallen behind, and reuse is
 * what bounds the backlog (a malloc that finds a fitting freed mapping
 * maps none). */
#define LULL_HUGE_QUEUE_BACKLOG ((uint64_t)256 << 20)
/* Queued address space over which a huge malloc that finds nothing to
 * reuse waits for the reclaim thread's next tick before it maps a new
 * block (reclaim_thread.c): reuse alone does not bound the queue when no
 * freed mapping fits (sizes that grow, alignments past a slice whose
 * blocks no slot names). A loop of aligned_alloc(1 GiB, n) and free() over
 * 200 sizes held 14 TiB of address space at its peak, though it reused
 * whatever fitted: each block mapped, touched and freed faster than the
 * reclaim thread unmapped them. Address space only: the blocks' pages were
 * purged or never touched. */
#define LULL_HUGE_QUEUE_WAIT ((uint64_t)16 << 30)

/* One slot as read at one moment. `h` must not be dereferenced unless a
 * claim below succeeded with this entry. */
typedef struct lull_huge_queue_entry {
    uint64_t word;
    lull_huge *h;
    size_t usable;
    int node;
    unsigned slot;
    uint32_t seq; /* push order: lower is older (compare with wrap) */
} lull_huge_queue_entry;

/* ---- any thread ------------------------------------------------------------ */

/* Queue a freed huge block (accounted as `freed`; the caller owns it and
 * gives it up). One CAS on a slot, or on the overflow stack. */
void lull_huge_queue_push(lull_huge *h);
/* The best fitting queued mapping of `node` for `size` (lull_huge_fits),
 * among those the cache would keep (block and header slice within
 * keep_bound) or, while the queue holds over LULL_HUGE_QUEUE_BACKLOG,
 * among all in slots; still accounted as `freed`, its block dirty. Or
 * NULL. No system call, no lock. */
lull_huge *lull_huge_queue_take(size_t size, int node, uint64_t keep_bound);
/* The best fitting mapping of `node` for `size` whose block starts at a
 * multiple of `alignment` (over a slice: such blocks are never in a slot,
 * their word cannot name them), from the overflow stack: taken whole, the
 * first LULL_HUGE_QUEUE_ALIGNED_LOOKS looked at, the rest given back.
 * Still accounted as `freed`, its block dirty; or NULL. No system call; a
 * walk of headers the caller owns while it looks, under a lock that fork's
 * prepare handler takes (below), which nests no other: a child copied
 * while a thread held mappings taken whole would have none of them. */
lull_huge *lull_huge_queue_take_aligned(size_t size, size_t alignment, int node);
#define LULL_HUGE_QUEUE_ALIGNED_LOOKS 64
/* Address space queued (slots and overflow); never below what they hold. */
uint64_t lull_huge_queue_bytes(void);
/* With no reclaim thread running (reclaim_thread.c's reuse): the first
 * queued mapping of `node` (slots and overflow) whose block, at a slice
 * past its header, fits `size` (lull_huge_fits); still accounted as
 * `freed`, its block dirty; or NULL. Every queued mapping is taken whole
 * and the others pushed back, under the lock of take_aligned (which fork's
 * prepare handler takes). No system call. */
lull_huge *lull_huge_queue_take_first_fit(size_t size, int node);

/* ---- the reclaim thread ------------------------------------------------------ */

/* Read slot i; false if it is empty. */
bool lull_huge_queue_peek(unsigned i, lull_huge_queue_entry *e);
/* Take e out of slot e->slot, if it still holds e: the mapping is then the
 * caller's (still accounted as `freed`). False: a malloc took it first. */
bool lull_huge_queue_claim(const lull_huge_queue_entry *e);
/* Take the whole overflow stack (newest first, linked by `next`). */
lull_huge *lull_huge_queue_take_overflow(void);

/* Fork's handlers (src/init.c): prepare takes the whole takes' lock,
 * after the heaps' locks (a late-heap allocation takes it holding
 * late_lock); parent and child let it go. */
void lull_huge_queue_fork_prepare(void);
void lull_huge_queue_fork_parent(void);
void lull_huge_queue_fork_child(void);

/* In the child after fork (from lull_huge_cache_after_fork_child): the
 * byte count taken again from what is queued (a push or take another
 * thread had half done is not the child's). */
void lull_huge_queue_after_fork_child(void);

#endif
