/* A new segment's header (128 KiB, resident from the moment it is mapped)
 * joins the resident estimate within the heap limit (base/resident.h):
 * the span search checked the room for header and span under the arena
 * lock, then segment_create counted the header without a check. The limit
 * is one atomic count that other threads grow without that lock (a huge
 * block, the warm reserve, another node's arena), so a growth landing
 * between the check and the count took the estimate past the limit by the
 * header: heap_limit_mb=64, two threads allocating 64 B to 3 MiB blocks
 * until refused, ended 148 KiB over it.
 *
 * The window is held open deterministically: the segment hook
 * (lull_segment_prepare_hook, called by segment_create before the header
 * is counted) takes every byte of room left, as such a thread would. An
 * arena of the test's own (the library's reclaim thread walks only
 * lull_arenas[]) with no segment yet, so the search must map one. */
#define _GNU_SOURCE
#include "base/config.h"
#include "base/resident.h"
#include "numa/arena.h"
#include "lull.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

static void (*library_hook)(void *segment, size_t len, int node);
static uint64_t taken; /* the room the "other thread" took */

static void take_the_room(void *segment, size_t len, int node) {
    if (library_hook) library_hook(segment, len, node);
    uint64_t room = lull_resident_room();
    if (room && lull_resident_try_grow(room)) taken += room;
}

static void setup(void) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64); /* the library is initialised: arenas, the clock */
    cr_assert_not_null(p);
    lull_free(p);
}

Test(limit_segment_header, a_new_segment_header_never_passes_the_limit, .init = setup) {
    static lull_arena a;
    memset(&a, 0, sizeof a);
    pthread_mutex_init(&a.lock, NULL);
    /* room for the header and a one-slice span, no more */
    uint64_t need = (uint64_t)(LULL_META_SLICES + 1) << LULL_SLICE_SHIFT;
    uint64_t limit = lull_resident_bytes() + need;
    __atomic_store_n(&lull_config.heap_limit_bytes, limit, __ATOMIC_RELAXED);
    library_hook = lull_segment_prepare_hook;
    lull_segment_prepare_hook = take_the_room;
    bool zeroed;
    lull_span *s = lull_arena_try_alloc_span(&a, 1, &zeroed);
    uint64_t resident = lull_resident_bytes();
    lull_segment_prepare_hook = library_hook;
    __atomic_store_n(&lull_config.heap_limit_bytes, 0, __ATOMIC_RELAXED);
    lull_resident_sub(taken);
    cr_assert_gt(taken, 0, "the hook took no room: the search mapped no segment");
    cr_assert_leq(resident, limit,
                  "the estimate passed the limit by %llu KiB (a segment's header counted "
                  "after the room was taken)",
                  (unsigned long long)(resident - limit) >> 10);
    cr_assert_null(s, "a span was taken with no room left");
}
