/* A realloc() that shrinks a block cannot run out of memory: the block it
 * has already holds the new size. lull moves a block shrunk below half its
 * usable size (so that the big block's memory goes back), and when that
 * move's new block is refused (heap_limit_mb, or the kernel's mmap), it
 * returned NULL with ENOMEM: a program at its heap limit could not shrink
 * a buffer to give memory back, and one that writes `p = realloc(p, n)`
 * lost its block. The shrink must keep the block instead, contents intact
 * and errno as the caller had it, and a free_sized() with the new size
 * must then pass lull's size check (which aborts on a size far below the
 * block's).
 *
 * No wait here counts on time: a refused allocation waits for the reclaim
 * thread's purge (bounded), and after it there is still no room, by
 * construction (nothing is free to purge: lull_purge_all() ran first). */
#define _GNU_SOURCE
#include "lull.h"
#include "base/resident.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void setup(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("warm_reserve_mb", "0"));
    void *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_free(p);
}

/* A limit that leaves about `room` bytes above what lull holds now, with
 * nothing free left to purge. */
static void limit_with_room(size_t room) {
    lull_purge_all();
    unsigned mb = (unsigned)((lull_resident_bytes() + room + MiB - 1) >> 20);
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    cr_assert_lt(lull_resident_room(), room + MiB);
}

static void fill(char *p, size_t n) {
    for (size_t i = 0; i < n; i += 512)
        p[i] = (char)(i >> 9);
}

static void expect_filled(const char *p, size_t n) {
    for (size_t i = 0; i < n; i += 512)
        cr_assert_eq(p[i], (char)(i >> 9), "byte %zu lost", i);
}

static void shrink_at_the_limit(size_t from, size_t to) {
    char *p = lull_malloc(from);
    cr_assert_not_null(p);
    fill(p, from);
    cr_assert_lt(to, lull_usable_size(p) / 2, "the realloc would keep the block anyway");
    /* less room than the smaller block needs */
    limit_with_room(to / 4);
    errno = 0;
    char *q = lull_realloc(p, to);
    cr_assert_not_null(q, "realloc(%zu -> %zu) of a block that holds it failed, errno %d", from, to,
                       errno);
    cr_assert_eq(errno, 0, "errno %d after a realloc that succeeded", errno);
    cr_assert_geq(lull_usable_size(q), to);
    expect_filled(q, to);
    memset(q, 5, to);
    /* the size the realloc asked for is the block's size now: a sized free
     * with it must pass lull's size check (C23's free_sized) */
    lull_free_sized(q, to);
}

Test(realloc_shrink_limit, a_huge_block_shrunk_to_a_large_size, .init = setup) {
    shrink_at_the_limit(40 * MiB, 8 * MiB);
}

Test(realloc_shrink_limit, a_large_block_shrunk_to_a_smaller_large_size, .init = setup) {
    shrink_at_the_limit(12 * MiB, 4 * MiB);
}

Test(realloc_shrink_limit, a_large_block_shrunk_to_a_small_size, .init = setup) {
    shrink_at_the_limit(4 * MiB, 256 * KiB); /* the class's span is 1 MiB */
}

Test(realloc_shrink_limit, reallocarray_shrinks_a_huge_block_too, .init = setup) {
    char *p = lull_malloc(40 * MiB);
    cr_assert_not_null(p);
    fill(p, 40 * MiB);
    limit_with_room(2 * MiB);
    errno = 0;
    char *q = lull_reallocarray(p, 1024, 8 * KiB);
    cr_assert_not_null(q, "reallocarray shrinking to 8 MiB failed, errno %d", errno);
    cr_assert_eq(errno, 0);
    expect_filled(q, 8 * MiB);
    lull_free_sized(q, 8 * MiB);
}

/* A huge block kept at the limit for a size under LULL_HUGE_SHRINK_MIN
 * (numa/huge.h: such a shrink moves the block when it can) still gives its
 * tail back: kept whole, a 40 MiB block shrunk to 512 KiB held all 40 MiB
 * at the limit, the very memory the realloc was to give back. */
Test(realloc_shrink_limit, a_huge_block_kept_for_a_small_size_gives_its_tail_back, .init = setup) {
    char *p = lull_malloc(40 * MiB);
    cr_assert_not_null(p);
    fill(p, 40 * MiB);
    limit_with_room(128 * KiB); /* under the 512 KiB block's span */
    uint64_t before = lull_resident_bytes();
    errno = 0;
    char *q = lull_realloc(p, 512 * KiB);
    cr_assert_eq(q, p, "the block moved: there was room for the smaller one");
    cr_assert_eq(errno, 0);
    expect_filled(q, 512 * KiB);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    uint64_t after = lull_resident_bytes();
    cr_assert_geq(before - after, 39 * MiB, "the resident estimate went down by %llu KiB only",
                  (unsigned long long)((before - after) >> 10));
    lull_free_sized(q, 512 * KiB);
}
