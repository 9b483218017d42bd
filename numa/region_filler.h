/* Placement that fills huge pages densely (issue 16; docs/architecture.md
 * "Huge pages"). With thp on, a span of fewer slices than a 2 MiB region
 * goes into the region, of all the arena's, with the fewest free slices
 * among those that have a run for it, as tcmalloc's Temeraire filler
 * does: nearly full regions become full (dense, and collapsed into huge
 * pages), and nearly empty ones drain until they are wholly free, to be
 * purged whole instead of split. First fit (the lowest run of the first
 * segment with one) filled whichever region came first, however empty. */
#ifndef LULL_REGION_FILLER_H
#define LULL_REGION_FILLER_H

#include <stdint.h>

/* The lowest bit at which `avail` has n (1..32) set bits in a row, or -1. */
static inline int lull_region_run_start(uint32_t avail, unsigned n) {
    /* after the loop, bit i of starts: bits i .. i + n - 1 of avail are set
     * (shifts bring in zeros above bit 31: no run leaves the region) */
    uint32_t starts = avail;
    for (unsigned have = 1; have < n && starts;) {
        unsigned step = have < n - have ? have : n - have;
        starts &= starts >> step;
        have += step;
    }
    return starts ? __builtin_ctz(starts) : -1;
}

/* The choice so far of a search over regions: the run's first slice in
 * `segment`, and how many free slices its region has. */
typedef struct lull_region_choice {
    void *segment;
    int first;
    unsigned region_free;
} lull_region_choice;

/* Consider the two regions of a 64-slice word (slices w*64 ..): `avail`,
 * the slices the current pass may take, `free_slices`, every free one.
 * Keeps the earlier of two equally full regions. */
static inline void lull_region_consider(lull_region_choice *best, void *segment, unsigned w,
                                        uint64_t avail, uint64_t free_slices, unsigned n) {
    for (unsigned h = 0; h < 2; h++) {
        uint32_t a = (uint32_t)(avail >> (32 * h));
        if (!a) continue;
        unsigned region_free = (unsigned)__builtin_popcount((uint32_t)(free_slices >> (32 * h)));
        if (best->segment && region_free >= best->region_free) continue;
        int at = lull_region_run_start(a, n);
        if (at < 0) continue;
        best->segment = segment;
        best->first = (int)(w * 64 + 32 * h) + at;
        best->region_free = region_free;
    }
}

#endif
