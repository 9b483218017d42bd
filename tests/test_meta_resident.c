/* A segment's metadata is made resident by the reclaim thread
 * (lull_arena_populate_metadata, numa/arena.h), so that request threads
 * take no page fault in it: a fault there waits for any holder of the
 * process's mmap lock, such as a huge-page collapse, which held a bulk
 * free's slowest free() for 5-9 ms (docs/architecture.md, "Huge pages").
 * Checked: after one reclaim tick every page of a new segment's metadata
 * is resident (mincore), and freeing most blocks of a segment, which starts
 * page parking in its spans and writes their parking rows, faults nothing
 * on the freeing thread. The purge delay is "never", so no page of a block
 * is purged (and faulted back) meanwhile. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>

#define BLOCK 1024
#define COUNT (24u << 20) / BLOCK /* 24 MiB: most of one segment */

static void *blocks[COUNT];

static size_t meta_pages_missing(lull_segment *s) {
    size_t len = LULL_PAGES_OF(LULL_META_END), pages = len / LULL_PAGE_SIZE, missing = 0;
    unsigned char vec[LULL_PAGES_OF(LULL_META_END) / LULL_PAGE_SIZE];
    cr_assert_eq(mincore(s, len, vec), 0);
    for (size_t i = 0; i < pages; i++)
        missing += !(vec[i] & 1);
    return missing;
}

#ifndef LULL_SANITIZED /* the sanitizers' shadow memory faults on its own */
static long thread_minor_faults(void) {
    struct rusage u;
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_minflt;
}
#endif

Test(meta_resident, the_reclaim_thread_makes_metadata_resident_and_frees_fault_nothing,
     .timeout = 60) {
    lull_set_purge_delay_ms(-1);
    for (unsigned i = 0; i < COUNT; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        memset(blocks[i], 0x5a, BLOCK);
    }
    lull_segment *seg = lull_segment_of(blocks[COUNT / 2]);
    size_t before = meta_pages_missing(seg);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    size_t after = meta_pages_missing(seg);
    cr_log_info("metadata pages not resident: %zu before the tick, %zu after", before, after);
    cr_assert_eq(after, 0, "%zu of the segment's metadata pages still not resident", after);
#ifndef LULL_SANITIZED /* the sanitizers' shadow memory faults on its own */
    /* three blocks of four freed: spans start parking (their rows written)
     * and their emptied pages park */
    long f0 = thread_minor_faults();
    for (unsigned i = 0; i < COUNT; i++)
        if (i % 4) lull_free(blocks[i]);
    long faults = thread_minor_faults() - f0;
    cr_assert_eq(faults, 0, "the frees took %ld page faults", faults);
#endif
}
