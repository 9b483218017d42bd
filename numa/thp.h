/* Transparent huge pages (thp=auto|always|never, docs/architecture.md
 * "Huge pages"). Segments are 32 MiB aligned, so each holds 16 regions of
 * 2 MiB, each a possible huge page (32 slices).
 *
 * - The reclaim thread collapses a region into a huge page (MADV_COLLAPSE,
 *   kernel 6.1+) once every slice of it is in use and no page of it is
 *   parked or purged: off the request path, where a huge page fault would
 *   zero 2 MiB (and maybe compact memory) inside a malloc. With
 *   thp=always, segments are also advised MADV_HUGEPAGE (by the reclaim
 *   thread: request threads never madvise), so that faults and khugepaged
 *   make huge pages too, and the bound below is off.
 * - The warm reserve (reclaim/warm_reserve.c) makes whole free regions
 *   huge pages of zeroes ahead of the heap's growth
 *   (lull_thp_prefault_region), so that new spans land on huge pages and
 *   the request thread neither faults their pages nor waits for a
 *   collapse of them.
 * - A region that is huge (its bit in the segment's lull_thp_regions) is not
 *   purged piecemeal: its free slices and parked pages wait until the
 *   whole region is free (then it goes back whole, 2 MiB in one purge), or
 *   until the memory they hold passes the bound (thp=auto: an eighth of
 *   the huge bytes, at least 8 MiB; none for thp=always), or for
 *   lull_purge_all() and the heap limit, which
 *   purge everything (and split). A purge inside a huge region clears its
 *   bit (a split); the next collapse may form it again.
 *
 * The huge bits (lull_thp_regions) are the reclaim thread's alone (it
 * collapses, and it claims what it purges, under its step lock). */
#ifndef LULL_THP_H
#define LULL_THP_H

#include "base/types.h"

#include <stdbool.h>
#include <stdint.h>

#define LULL_THP_REGION_SLICES 32 /* 2 MiB */
#define LULL_THP_REGIONS (LULL_SLICES / LULL_THP_REGION_SLICES)

/* This module's part of a segment (base/types.h, LULL_META_THP), written by
 * the reclaim thread only. */
typedef struct lull_thp_regions {
    /* bit r: the 2 MiB region r was collapsed into a huge page and is not
     * split since */
    _Atomic uint16_t huge;
    uint8_t advised; /* thp=always: MADV_HUGEPAGE given */
} lull_thp_regions;
LULL_META_PART_CHECK(lull_thp_regions, THP);
_Static_assert(LULL_THP_REGIONS <= 16, "a bit a region in lull_thp_regions.huge");

static inline lull_thp_regions *lull_thp_regions_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_THP_AT);
}

typedef enum {
    LULL_THP_OFF,         /* thp=never */
    LULL_THP_ON,          /* auto or always, and the kernel lets lull collapse */
    LULL_THP_UNAVAILABLE, /* asked for, but the system has THP off or no MADV_COLLAPSE */
} lull_thp_state;

/* What thp is in force (decided at the first call). */
lull_thp_state lull_thp_state_now(void);
static inline bool lull_thp_on(void) {
    return lull_thp_state_now() == LULL_THP_ON;
}

/* Claims (under the reclaim thread's step lock): of the slices `want` of
 * word w about to be purged, those that may be (not in a huge region that
 * is not wholly free, while huge regions are kept); `free_bits` are the
 * word's free slices. The rest is counted as held. */
uint64_t lull_thp_purgeable(lull_segment *s, unsigned w, uint64_t want, uint64_t free_bits);
/* The slices `purged` of word w were claimed for a purge: huge regions
 * among them are huge no more (split, unless wholly free). */
void lull_thp_note_purge(lull_segment *s, unsigned w, uint64_t purged, uint64_t free_bits);
/* The `pages` parked pages of `slice` may be purged (not in a kept huge
 * region); if not, they are counted as held. */
bool lull_thp_pages_purgeable(lull_segment *s, unsigned slice, unsigned pages);
/* A parked page of `slice` was claimed for a purge. */
void lull_thp_note_page_purge(lull_segment *s, unsigned slice);

/* The reclaim thread's tick, before its collapses: whether huge regions
 * are kept (what they held last tick within the bound). False when thp is
 * not on. */
bool lull_thp_tick_start(void);
/* Collapse up to `max` dense regions of the segment, and none once the
 * calling thread's CPU time passes until_cpu_ns (0: no such bound); the
 * number tried. */
unsigned lull_thp_collapse_dense(lull_segment *s, unsigned max, uint64_t until_cpu_ns);
/* The calling thread's CPU time, ns. */
uint64_t lull_thp_thread_cpu_ns(void);
/* The warm reserve's (reclaim/warm_reserve.c): region r, every slice of it
 * claimed clean (no page present), made one huge page of zeroes; false if
 * that failed (the region is then as it was but for its first page,
 * faulted in and still zero). */
bool lull_thp_prefault_region(lull_segment *s, unsigned r);
/* The region of `slice` is huge and kept (some slice of it in use, and
 * huge regions kept this tick): purging any of it would split it. */
bool lull_thp_region_kept(lull_segment *s, unsigned slice);

/* Counters (docs: include/lull/counters.h, struct lull_counters_thp). */
typedef struct {
    uint64_t huge_bytes; /* regions lull collapsed and not split since */
    uint64_t collapses;  /* count */
    uint64_t collapse_failures;
    uint64_t splits;       /* count: huge regions purged piecemeal */
    uint64_t whole_purges; /* count: huge regions purged whole (all free) */
    uint64_t held_bytes;   /* free slices and parked pages kept in huge regions now */
    uint64_t held_regions; /* huge regions whose free slices wait (splits avoided), last tick */
    uint64_t prefaulted_regions; /* count: regions the warm reserve made huge */
} lull_thp_counters;
void lull_thp_read(lull_thp_counters *out);

#endif
