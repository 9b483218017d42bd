/* Huge blocks aligned past a segment (64 MiB, 1 GiB) take the address space
 * of their header's segment and their block, not of the alignment's slack:
 * with the slack a loop of aligned_alloc(1 GiB, 100) and free() held 2 GiB
 * of address space a block until the reclaim thread unmapped it, and ran
 * out of address space (ENOMEM at 128 TiB) where glibc stays at 2 MiB. */
#define _GNU_SOURCE
#include "base/os.h"
#include "base/types.h"
#include "lull.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define BLOCKS 32

static void setup(void) {
    /* nothing freed is unmapped while the test counts */
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
}

static size_t address_space(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    unsigned long size = 0;
    if (f) {
        if (fscanf(f, "%lu", &size) != 1) size = 0;
        fclose(f);
    }
    return size * (size_t)sysconf(_SC_PAGESIZE);
}

/* The address space of `n` live blocks of `size` at `align` (nothing is
 * freed while it counts: the reclaim thread's unmaps do not blur it). */
static size_t space_of_blocks(size_t align, size_t size, int n) {
    static char *b[BLOCKS];
    size_t before = address_space();
    for (int i = 0; i < n; i++) {
        b[i] = lull_aligned_alloc(align, size);
        cr_assert_not_null(b[i], "block %d of %zu bytes at %zu failed", i, size, align);
        cr_assert_eq((uintptr_t)b[i] % align, 0, "block %p is not aligned to %zu", (void *)b[i],
                     align);
        cr_assert_geq(lull_usable_size(b[i]), size);
        /* its first and last bytes: a block placed wrong overlaps one */
        b[i][0] = b[i][size - 1] = (char)(i + 1);
    }
    size_t grew = address_space() - before;
    for (int i = 0; i < n; i++) {
        cr_assert(b[i][0] == (char)(i + 1) && b[i][size - 1] == (char)(i + 1),
                  "block %d overwritten", i);
        lull_free(b[i]);
    }
    cr_log_info("%d blocks of %zu bytes at %zu MiB: +%zu MiB of address space", n, size,
                align >> 20, grew >> 20);
    return grew;
}

/* How many blocks at `align` the huge region holds at once, up to BLOCKS,
 * with room to spare: past it, a block finds every boundary taken and is
 * mapped with the slack (the fallback). The region is 512 GiB, but 32 GiB
 * under ThreadSanitizer (base/os.c). */
static int blocks_the_region_holds(size_t align) {
    uintptr_t lo, hi;
    lull_os_huge_region(&lo, &hi);
    size_t fit = (hi - lo) / (align + 2 * LULL_SEGMENT_SIZE) / 2;
    return fit < BLOCKS ? (int)fit : BLOCKS;
}

/* the header's segment and the block's room: 32 MiB and a page; the slack
 * made it 1 GiB + 32 MiB a block */
Test(aligned_huge_space, a_block_aligned_to_a_gib_takes_no_slack, .init = setup) {
    int n = blocks_the_region_holds((size_t)1 << 30);
    cr_assert_geq(n, 8, "a huge region of %d GiB-aligned blocks only", n);
    cr_assert_leq(space_of_blocks((size_t)1 << 30, 100, n), (size_t)n * 40 * MiB);
}

/* 32 + 41 MiB; the slack made it 64 + 73 MiB */
Test(aligned_huge_space, a_block_aligned_to_64_mib_takes_no_slack, .init = setup) {
    int n = blocks_the_region_holds(64 * MiB);
    cr_assert_leq(space_of_blocks(64 * MiB, 40 * MiB, n), (size_t)n * 80 * MiB);
}
