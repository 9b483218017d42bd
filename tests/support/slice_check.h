/* The slice-state invariant (docs/architecture.md, invariant 1) checked over
 * every segment of every arena: for tests that look at the state a fork, a
 * race or a sequence of calls left behind.
 *
 * For each slice of each segment:
 * - it is in at most one of the maps dirty, purging, clean and warm (a
 *   slice in two is handed out twice, or purged while it is handed out);
 * - lazy is a subset of clean (it means "clean, but purged with MADV_FREE");
 * - a slice in a map is free, so no live span covers it: span_head[i] == 0
 *   (span_head[i] is the offset of the span descriptor that covers slice i,
 *   and 0 for a free slice; the metadata slices are in no map);
 * - strict only: a slice in no map (IN_USE) is covered by a span, else it is
 *   leaked. Only meaningful when no other thread can be half way through
 *   taking or giving back a span (the arena takes the slices' bits before it
 *   sets span_head, and gives them back after clearing it): e.g. in a fork
 *   child whose parent had no request thread but the one that forked.
 *
 * No Criterion and no allocation: usable in a fork child before it exits.
 * The maps are read atomically but not as one snapshot: call it while
 * nothing moves slices (no reclaim thread running, or held). */
#ifndef LULL_TEST_SLICE_CHECK_H
#define LULL_TEST_SLICE_CHECK_H

#include <stdbool.h>
#include <stddef.h>

typedef struct slice_check_counts {
    size_t segments;
    size_t dirty, purging, clean, lazy, warm; /* slices in each map */
    size_t in_use;                            /* in no map, covered by a span */
    size_t leaked;                            /* in no map, covered by none */
} slice_check_counts;

/* True if the invariant holds. Otherwise false, and the first violation is
 * written to msg (NUL-terminated, cut at len), naming the segment, the
 * slice and the maps. counts (may be NULL) gets the slices of each state
 * as far as the walk went. */
bool slice_check(bool strict, slice_check_counts *counts, char *msg, size_t len);

#endif
