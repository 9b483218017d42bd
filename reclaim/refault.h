/* The refault monitor as the reclaim thread drives it: which purged pages
 * come back, and how soon.
 *
 * Mechanism (refault_monitor=): auto uses PAGEMAP_SCAN's present bit over
 * slices that were taken again after a purge (no userfaultfd registration:
 * measured on 6.18, a registered VMA turns every MADV_DONTNEED into a
 * process-wide mmap_lock holder, and other threads' mmap/munmap then wait
 * for milliseconds; see docs/refault.md); on also allows userfaultfd
 * WP_ASYNC (whole segments registered once, purged ranges armed again after
 * each purge, written pages read back with PAGEMAP_SCAN); off, or a kernel
 * without PAGEMAP_SCAN, leaves the allocator's own slice-level accounting
 * (every reuse of a purged slice is counted on the arena slow path). */
#ifndef LULL_REFAULT_H
#define LULL_REFAULT_H

#include "lull/counters.h"

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

void lull_refault_start(void);                         /* reclaim thread start */
void lull_refault_after_purge(void *addr, size_t len); /* before the slices are released */
void lull_refault_tick(uint32_t now_ms);
void lull_refault_after_fork_child(void);
/* Pages of purged slices seen in use again, a count: the monitor's own where
 * the kernel tells it which pages came back, else 16 for each purged slice
 * taken again (the arena's accounting). */
uint64_t lull_refault_pages_back(void);
/* The monitor's page count (the reclaim thread adds what each scan finds;
 * a test that fakes demand adds to it, and to the policy's
 * refaulted_slices for the accounting). */
extern _Atomic uint64_t lull_refault_pages_seen;
/* Fill the refault fields of the counter page; returns the mechanism. */
uint64_t lull_refault_fill_counters(struct lull_counters *out);

#endif
