/* Huge blocks (over LULL_LARGE_MAX): a mapping each, whose header sits at a
 * 32 MiB boundary so the address mask finds it like a segment. Freeing one
 * never unmaps on the calling thread: the mapping goes to the reclaim
 * thread (its cache of freed mappings, or its queue) and free() returns at
 * once; a later huge malloc takes a cached or queued mapping that fits
 * instead of mapping a new one. */
#ifndef LULL_HUGE_H
#define LULL_HUGE_H

#include "base/hidden.h"
#include "base/types.h"

/* What of a huge block's block_offset counts as resident and metadata: the
 * header's slice, at every alignment. Only the header's first page is ever
 * written; an alignment over a slice puts the block that much further on,
 * and the pages in between are never touched (slack). Counted whole, 20 MiB
 * blocks at 32 MiB alignment each took 52 MiB of the heap limit: 2 fitted
 * under 128 MiB where 6 did at 64 KiB alignment. */
#define LULL_HUGE_HEADER_BYTES LULL_SLICE_SIZE

/* Every huge byte is in one of these, per node: mapped = live + metadata
 * (the header slice, LULL_HUGE_HEADER_BYTES) + slack (address space never
 * touched: before the aligned header, between the header slice and a block
 * aligned further on, after the block) + freed (queued for the reclaim
 * thread) + the header and block of the mappings in the reclaim thread's
 * cache, which its own walk counts (reclaim/huge_cache.h: a cached mapping
 * is in one slot word, and the walk reads only those words). */
typedef struct lull_huge_accounting {
    _Atomic uint64_t mapped, live, metadata, slack, freed;
    _Atomic uint64_t reused, fresh; /* counts: allocations that reused a freed mapping / mapped */
} lull_huge_accounting;
extern LULL_HIDDEN lull_huge_accounting lull_huge_acct[LULL_MAX_NODES];

/* A huge block homed on arena `node` (bound before its first touch); its
 * header and block count in the resident estimate, within the heap limit
 * (base/resident.h: over it, the reclaim thread is asked to purge, once,
 * and then NULL with ENOMEM). */
void *lull_huge_alloc(size_t size, size_t alignment, bool *zeroed, int node);
void lull_huge_free(lull_huge *h, void *p);
/* realloc of a huge block to `size`: extend its mapping in place when the
 * address space after it is free. False: the caller must copy (and for a
 * size over LULL_MAX_ALLOC, whose malloc fails, keeps the block as it is). */
bool lull_huge_grow_in_place(lull_huge *h, size_t size);
/* realloc of a huge block to a `size` (non-zero) under half its usable
 * size, at least LULL_HUGE_SHRINK_MIN (or kept because the move found no
 * memory): keep the block where it is, its usable size the size's pages,
 * and hand the mapping's tail after them (the block's pages given up, maybe
 * resident, and the slack after the block) to lull_huge_tail_hook, which
 * gives it back on the reclaim thread. A copy to a new block took 120-320
 * ms for a 23 MiB block. False (no hook): the caller copies. */
bool lull_huge_shrink_in_place(lull_huge *h, size_t size);
/* The least size realloc shrinks a huge block to in place: its header
 * slice is then at most a sixteenth of what it keeps. Below, the block
 * moves to a small or large one (a copy of at most 1 MiB), and is shrunk
 * in place only if that move finds no memory: kept in place, each
 * block shrunk to 100 bytes held its own mapping, VMA and 68 KiB of the
 * resident estimate, and a loop of malloc(20 MiB) and realloc(p, 100) ran
 * out of a 64 MiB heap limit after 658 blocks
 * (huge_realloc_shrink.a_block_shrunk_to_a_small_size_moves). */
#define LULL_HUGE_SHRINK_MIN (16 * LULL_HUGE_HEADER_BYTES)
/* Take a tail cut off a huge block: [start, start + len), page aligned,
 * its first `dirty` bytes the block's (maybe resident, counted in the
 * resident estimate and as `freed`), the rest slack; accounting node
 * `node`. Set by reclaim/. */
extern void (*lull_huge_tail_hook)(void *start, size_t len, size_t dirty, int node);
/* Unmap such a tail (the reclaim thread, after its purge; or inline as
 * lull_huge_unmap is): its bytes leave the accounting and the resident
 * estimate. */
void lull_huge_unmap_tail(void *start, size_t len, size_t dirty, int node);
/* Hand a freed huge block to whoever gives it back to the kernel (the
 * reclaim thread's cache or queue; set by reclaim/). */
extern void (*lull_huge_release_hook)(lull_huge *h);
/* A freed huge block of arena `node` with room for `size`, its block at a
 * multiple of `alignment`, taken from the reclaim thread's cache or its
 * queue of mappings not yet given back (reclaim/huge_queue.h) without a
 * system call, accounted as `freed`; or NULL. *zeroed: its block is known
 * to be zero (purged with MADV_DONTNEED). Set by reclaim/. */
extern lull_huge *(*lull_huge_reuse_hook)(size_t size, size_t alignment, int node, bool *zeroed);
/* The bytes of address space the freed mappings still hold (the reclaim
 * thread's cache and queue, and the tails of shrunk blocks), which its
 * forced tick gives back; set by reclaim/. */
extern uint64_t (*lull_huge_held_hook)(void);
/* Unmap a huge block's mapping (only ever called by the reclaim thread, or
 * inline when configured and no reclaim thread runs). block_resident: its
 * block is counted in the resident estimate (base/resident.h), as a live,
 * freed or dirty cached block is and a purged cached one is not. */
void lull_huge_unmap(lull_huge *h, bool block_resident);

#endif
