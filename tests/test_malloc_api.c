/* The malloc family as lull_* (src/entry.c, src/alloc.c, numa/huge.c): zeroing,
 * realloc across small / large / huge, alignment, the error cases and their
 * errno, usable sizes, ownership, and what happens when mmap fails. */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/deferred_free.h"
#include "lull/counters.h"
#include "base/fault.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"
#include "base/os.h"
#include "base/types.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <malloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- helpers ------------------------------------------------------------ */

static uint8_t pattern_byte(const void *base, size_t i, uint64_t seed) {
    uint64_t x = ((uintptr_t)base ^ seed) + i * 0x9e3779b97f4a7c15ULL;
    x ^= x >> 29;
    return (uint8_t)(x ^ (x >> 8) ^ 0x5a);
}

/* Every byte when small, else every 64th byte and the last one. */
static size_t stride_for(size_t len) {
    return len <= 64 * KiB ? 1 : 64;
}

static void fill(void *p, size_t len, uint64_t seed) {
    uint8_t *b = p;
    size_t st = stride_for(len);
    for (size_t i = 0; i < len; i += st)
        b[i] = pattern_byte(p, i, seed);
    if (len) b[len - 1] = pattern_byte(p, len - 1, seed);
}

/* Check the pattern written at `orig` (with fill(orig, len, seed)) now at p. */
static bool check_moved(const void *p, const void *orig, size_t len, size_t orig_len,
                        uint64_t seed) {
    const uint8_t *b = p;
    size_t st = stride_for(orig_len);
    for (size_t i = 0; i < len; i += st)
        if (b[i] != pattern_byte(orig, i, seed)) return false;
    if (len == orig_len && len && b[len - 1] != pattern_byte(orig, len - 1, seed)) return false;
    return true;
}

static bool all_zero(const void *p, size_t len) {
    const uint8_t *b = p;
    for (size_t i = 0; i < len; i++)
        if (b[i]) return false;
    return true;
}

static void init(void) {
    lull_size_classes_init();
}

/* ---- malloc / calloc ---------------------------------------------------- */

Test(malloc_api, malloc_zero_and_small_sizes_give_distinct_usable_blocks, .init = init) {
    enum { N = 4000 };
    static void *ptrs[N];
    static size_t sizes[N];
    uint64_t x = 88172645463325252ULL;
    for (int i = 0; i < N; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        sizes[i] = i == 0 ? 0 : (size_t)(x % (i % 10 == 0 ? 200 * KiB : 600));
        ptrs[i] = lull_malloc(sizes[i]);
        cr_assert_not_null(ptrs[i], "malloc(%zu)", sizes[i]);
        cr_assert_eq((uintptr_t)ptrs[i] % 8, 0);
        cr_assert_geq(lull_usable_size(ptrs[i]), sizes[i] ? sizes[i] : 1);
        fill(ptrs[i], sizes[i], (uint64_t)i);
    }
    /* no two live blocks overlap: every pattern is intact */
    for (int i = 0; i < N; i++)
        cr_assert(check_moved(ptrs[i], ptrs[i], sizes[i], sizes[i], (uint64_t)i),
                  "block %d (%zu B at %p) was overwritten", i, sizes[i], ptrs[i]);
    for (int i = 0; i < N; i++)
        lull_free(ptrs[i]);
}

/* Dirty every byte of a small block, one byte per 512 of a bigger one, one
 * per 16 pages above 1 MiB (page faults are slow in some VMs); the checks
 * look at the same bytes. */
static size_t dirty_step(size_t len) {
    return len <= 64 * KiB ? 1 : len <= MiB ? 512 : 64 * KiB + 8;
}

static void dirty(void *p, size_t len, unsigned char v) {
    unsigned char *b = p;
    for (size_t i = 0; i < len; i += dirty_step(len))
        b[i] = v;
    b[len - 1] = v;
}

static bool zero_where_dirtied(const void *p, size_t len) {
    const unsigned char *b = p;
    for (size_t i = 0; i < len; i += dirty_step(len))
        if (b[i]) return false;
    return b[len - 1] == 0;
}

Test(malloc_api, calloc_zeroes_fresh_and_reused_memory, .init = init) {
    static const size_t sizes[] = {1,         8,       24,      100,      1000,     1024,
                                   1025,      5000,    40000,   70000,    300000,   512 * KiB,
                                   513 * KiB, 1 * MiB, 3 * MiB, 16 * MiB, 17 * MiB, 20 * MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t s = sizes[k];
        int n = s > MiB ? 2 : 8;
        for (int round = 0; round < 3; round++) {
            /* dirty some blocks of this size, free them, calloc again */
            void *d[8];
            for (int i = 0; i < n; i++) {
                d[i] = lull_malloc(s);
                cr_assert_not_null(d[i]);
                dirty(d[i], s, 0xff);
            }
            for (int i = 0; i < n; i++)
                lull_free(d[i]);
            void *z[8];
            for (int i = 0; i < n; i++) {
                z[i] = lull_calloc(1, s);
                cr_assert_not_null(z[i], "calloc(1, %zu)", s);
                cr_assert(zero_where_dirtied(z[i], s),
                          "calloc(1, %zu) = %p is not zeroed (round %d)", s, z[i], round);
                dirty(z[i], s, 0xee);
            }
            for (int i = 0; i < n; i++)
                lull_free(z[i]);
        }
        /* count x size form */
        uint64_t *a = lull_calloc(s / 8 + 1, 8);
        cr_assert_not_null(a);
        cr_assert(zero_where_dirtied(a, (s / 8 + 1) * 8));
        lull_free(a);
    }
}

Test(malloc_api, calloc_of_the_last_freed_block_is_zeroed, .init = init) {
    /* the same block comes back (LIFO free list), dirty */
    for (size_t s = 8; s <= 4096; s += s / 4 + 8) {
        unsigned char *p = lull_malloc(s);
        cr_assert_not_null(p);
        memset(p, 0xa5, s);
        lull_free(p);
        complete_last_free();
        unsigned char *q = lull_calloc(s, 1);
        cr_assert_eq(q, p, "the freed block was not reused (size %zu)", s);
        cr_assert(all_zero(q, s), "calloc(%zu) reused a dirty block without zeroing it", s);
        lull_free(q);
    }
}

Test(malloc_api, calloc_overflow_is_enomem, .init = init) {
    errno = 0;
    cr_assert_null(lull_calloc(SIZE_MAX / 2, 3));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(lull_calloc((size_t)1 << 33, (size_t)1 << 33));
    cr_assert_eq(errno, ENOMEM);
    errno = 0;
    cr_assert_null(lull_calloc(1, (size_t)1 << 62));
    cr_assert_eq(errno, ENOMEM);
}

Test(malloc_api, impossible_sizes_are_enomem, .init = init) {
    static const size_t sizes[] = {SIZE_MAX, SIZE_MAX - 4095, (size_t)1 << 62, (size_t)1 << 50,
                                   ((size_t)1 << 46) + 1};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        errno = 0;
        void *p = lull_malloc(sizes[k]);
        cr_assert_null(p, "malloc(%#zx) = %p", sizes[k], p);
        cr_assert_eq(errno, ENOMEM, "malloc(%#zx): errno %d", sizes[k], errno);
        errno = 0;
        p = lull_aligned_alloc(4096, sizes[k]);
        cr_assert_null(p);
        cr_assert_eq(errno, ENOMEM);
        void *q = (void *)1;
        cr_assert_eq(lull_posix_memalign(&q, 64, sizes[k]), ENOMEM);
        cr_assert_eq(q, (void *)1, "posix_memalign wrote *out on failure");
    }
    /* a failed request leaves the allocator working */
    void *p = lull_malloc(100);
    cr_assert_not_null(p);
    lull_free(p);
}

/* posix_memalign reports its error in its result and leaves errno as it
 * was (the Linux manual: "The value of errno is not set"). GCC counts on
 * that: it keeps errno in a register across a call of posix_memalign, so a
 * caller's check of errno after one saw the old value or lull's ENOMEM
 * depending on the optimisation level. glibc 2.36 sets ENOMEM too. */
Test(malloc_api, a_failed_posix_memalign_leaves_errno_alone, .init = init) {
    static const struct {
        size_t alignment, size;
    } cases[] = {
        {64, SIZE_MAX},        {4096, (size_t)1 << 62}, {(size_t)1 << 62, 64},
        {(size_t)1 << 63, 64}, {(size_t)1 << 47, 0},    {8, ((size_t)1 << 46) + 1},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        void *q = (void *)1;
        errno = EDOM;
        int rc = lull_posix_memalign(&q, cases[k].alignment, cases[k].size);
        cr_assert_eq(rc, ENOMEM, "posix_memalign(%#zx, %#zx) = %d", cases[k].alignment,
                     cases[k].size, rc);
        cr_assert_eq(errno, EDOM, "posix_memalign(%#zx, %#zx) set errno to %d", cases[k].alignment,
                     cases[k].size, errno);
        cr_assert_eq(q, (void *)1);
    }
    errno = EDOM;
    void *q = (void *)1;
    cr_assert_eq(lull_posix_memalign(&q, 3, 64), EINVAL);
    cr_assert_eq(errno, EDOM);
}

/* ---- realloc ------------------------------------------------------------ */

Test(malloc_api, realloc_null_is_malloc_and_zero_frees, .init = init) {
    void *p = lull_realloc(NULL, 200);
    cr_assert_not_null(p);
    cr_assert_geq(lull_usable_size(p), 200);
    memset(p, 1, 200);
    errno = 0;
    cr_assert_null(lull_realloc(p, 0));
    /* the block was freed: the next malloc of its class gets it back */
    complete_last_free();
    void *q = lull_malloc(200);
    cr_assert_eq(q, p, "realloc(p, 0) did not free p");
    lull_free(q);

    void *big = lull_realloc(NULL, 20 * MiB);
    cr_assert_not_null(big);
    cr_assert_geq(lull_usable_size(big), 20 * MiB);
    cr_assert_null(lull_realloc(big, 0));
}

Test(malloc_api, realloc_keeps_contents_small_large_huge_small, .init = init) {
    static const size_t chain[] = {1,        7,        64,        1000,      1024,      1025,
                                   4096,     70000,    512 * KiB, 600 * KiB, 3 * MiB,   16 * MiB,
                                   17 * MiB, 40 * MiB, 20 * MiB,  16 * MiB,  900 * KiB, 100000,
                                   300,      5,        48 * MiB,  24,        0x10000,   1};
    size_t n = sizeof chain / sizeof chain[0];
    for (int seed = 0; seed < 2; seed++) {
        size_t len = chain[0];
        void *p = lull_malloc(len);
        cr_assert_not_null(p);
        fill(p, len, (uint64_t)seed);
        for (size_t k = 1; k < n; k++) {
            size_t want = chain[k];
            void *old = p;
            void *q = lull_realloc(p, want);
            cr_assert_not_null(q, "realloc(%zu -> %zu)", len, want);
            cr_assert_geq(lull_usable_size(q), want);
            size_t kept = len < want ? len : want;
            cr_assert(check_moved(q, old, kept, len, (uint64_t)seed),
                      "realloc %zu -> %zu (%p -> %p) lost contents", len, want, old, q);
            p = q;
            len = want;
            fill(p, len, (uint64_t)seed);
        }
        lull_free(p);
    }
}

Test(malloc_api, realloc_across_every_class_boundary, .init = init) {
    for (unsigned c = 1; c + 1 < lull_class_count; c++) {
        size_t b = lull_classes[c].block_size;
        size_t sizes[] = {b, b + 1, b - 1 ? b - 1 : 1, b / 2 + 1, 2 * b + 3};
        void *p = lull_malloc(b);
        cr_assert_not_null(p);
        size_t len = b;
        fill(p, len, c);
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            void *old = p;
            p = lull_realloc(p, sizes[k]);
            cr_assert_not_null(p);
            size_t kept = len < sizes[k] ? len : sizes[k];
            cr_assert(check_moved(p, old, kept, len, c), "class %u: realloc %zu -> %zu", c, len,
                      sizes[k]);
            cr_assert_geq(lull_usable_size(p), sizes[k]);
            len = sizes[k];
            fill(p, len, c);
        }
        lull_free(p);
    }
}

/* lull's resident figure (everything it maps but what is purged) and its
 * live bytes: the process's RSS, less what is not lull's (a sanitizer's
 * shadow, the test's own memory). */
static void lull_resident_live(uint64_t *resident, uint64_t *live) {
    struct lull_counters c;
    lull_stats(&c);
    *resident = lull_counters_resident_bound(&c.total) - c.total.warm;
    *live = c.total.live;
}

/* realloc(p, 1 MiB) of a touched 256 MiB block kept the whole block (and
 * 265 MB resident) for good, and 12 MiB down to 600 KiB the same: a
 * shrinking realloc to less than half now moves the block, and the old one
 * goes to the reclaim thread like any free. */
static void expect_shrink_returns_the_tail(size_t from, size_t to) {
    lull_set_purge_delay_ms(0);
    uint64_t res0, live0, res1, live1;
    lull_resident_live(&res0, &live0);
    uint8_t *p = lull_malloc(from);
    cr_assert_not_null(p);
    for (size_t off = 0; off < from; off += 4096)
        p[off] = (uint8_t)(off >> 12);
    uint8_t *q = lull_realloc(p, to);
    cr_assert_not_null(q);
    for (size_t off = 0; off < to; off += 4096)
        cr_assert_eq(q[off], (uint8_t)(off >> 12), "%zu -> %zu: byte %zu lost", from, to, off);
    bool back = false;
    for (int tick = 0; tick < 8 && !back; tick++) {
        cr_assert(lull_reclaim_now());
        lull_resident_live(&res1, &live1);
        back = res1 <= res0 + to + 8 * MiB;
    }
    cr_assert(back, "%zu -> %zu: lull keeps %llu KiB resident (%llu KiB before), %llu KiB live",
              from, to, (unsigned long long)res1 >> 10, (unsigned long long)res0 >> 10,
              (unsigned long long)live1 >> 10);
    cr_assert_leq(live1, live0 + from / 2, "%zu -> %zu: the whole block still counts live", from,
                  to);
    lull_free(q);
}

Test(malloc_api, a_shrinking_realloc_of_a_huge_block_returns_the_tail, .init = init) {
    expect_shrink_returns_the_tail(256 * MiB, 1 * MiB);
}

Test(malloc_api, a_shrinking_realloc_of_a_large_block_returns_the_tail, .init = init) {
    expect_shrink_returns_the_tail(12 * MiB, 600 * KiB);
}

Test(malloc_api, reallocarray_checks_overflow, .init = init) {
    int *a = lull_reallocarray(NULL, 100, sizeof(int));
    cr_assert_not_null(a);
    for (int i = 0; i < 100; i++)
        a[i] = i * 3;
    errno = 0;
    cr_assert_null(lull_reallocarray(a, SIZE_MAX / 2, 4));
    cr_assert_eq(errno, ENOMEM);
    /* a is untouched and still ours */
    for (int i = 0; i < 100; i++)
        cr_assert_eq(a[i], i * 3);
    int *b = lull_reallocarray(a, 5000, sizeof(int));
    cr_assert_not_null(b);
    for (int i = 0; i < 100; i++)
        cr_assert_eq(b[i], i * 3);
    lull_free(b);
}

/* realloc of a huge block to a size no block can have: NULL with ENOMEM,
 * and the block is untouched and still the caller's (growing in place used
 * to add the header's offset to the size before checking it, which wrapped
 * and "fitted"). */
static void huge_realloc_to_impossible_sizes(size_t alignment) {
    static const size_t sizes[] = {SIZE_MAX,
                                   SIZE_MAX - 4096,
                                   SIZE_MAX - 100,
                                   SIZE_MAX - (64 * KiB) + 1,
                                   (SIZE_MAX >> 1) + 1,
                                   ((size_t)1 << 46) + 1};
    const size_t len = 20 * MiB;
    void *p = alignment ? lull_aligned_alloc(alignment, len) : lull_malloc(len);
    cr_assert_not_null(p);
    fill(p, len, 7);
    size_t usable = lull_usable_size(p);
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        errno = 0;
        void *q = lull_realloc(p, sizes[k]);
        cr_assert_null(q, "alignment %zu: realloc(%p, %#zx) = %p", alignment, p, sizes[k], q);
        cr_assert_eq(errno, ENOMEM, "alignment %zu: realloc(%#zx): errno %d", alignment, sizes[k],
                     errno);
        cr_assert_eq(lull_usable_size(p), usable, "realloc(%#zx) changed the block's size",
                     sizes[k]);
        errno = 0;
        q = lull_reallocarray(p, 1, sizes[k]);
        cr_assert_null(q, "reallocarray(%p, 1, %#zx) = %p", p, sizes[k], q);
        cr_assert_eq(errno, ENOMEM);
    }
    cr_assert(check_moved(p, p, len, len, 7), "a failed realloc changed the block's contents");
    /* the block still grows and shrinks normally, and frees */
    void *r = lull_realloc(p, len + MiB);
    cr_assert_not_null(r);
    cr_assert(check_moved(r, p, len, len, 7));
    lull_free_sized(r, len + MiB);
}

Test(malloc_api, realloc_of_a_huge_block_to_an_impossible_size_is_enomem, .init = init) {
    huge_realloc_to_impossible_sizes(0);
    huge_realloc_to_impossible_sizes(32 * MiB); /* the header a segment before the block */
}

/* ---- alignment ---------------------------------------------------------- */

static void aligned_case(size_t align, size_t size, bool posix) {
    void *p = NULL;
    errno = 0;
    if (posix) {
        int rc = lull_posix_memalign(&p, align, size);
        cr_assert_eq(rc, 0, "posix_memalign(%zu, %zu) = %d", align, size, rc);
    } else {
        p = lull_aligned_alloc(align, size);
        cr_assert_not_null(p, "aligned_alloc(%zu, %zu): errno %d", align, size, errno);
    }
    cr_assert_eq((uintptr_t)p % align, 0, "alignment %zu, size %zu: %p", align, size, p);
    cr_assert(lull_owns(p));
    size_t usable = lull_usable_size(p);
    cr_assert_geq(usable, size, "alignment %zu, size %zu: usable %zu", align, size, usable);
    /* the whole usable range is writable */
    volatile uint8_t *b = p;
    b[0] = 1;
    b[usable - 1] = 2;
    b[size / 2] = 3;
    lull_free_aligned_sized(p, align, size);
}

static const size_t align_sizes[] = {1,       7,       100,      4096,     65536,   100000,
                                     1 * MiB, 5 * MiB, 16 * MiB, 17 * MiB, 48 * MiB};

static void aligned_range(size_t from, size_t to) {
    for (size_t a = from; a <= to; a *= 2)
        for (size_t k = 0; k < sizeof align_sizes / sizeof align_sizes[0]; k++) {
            aligned_case(a, align_sizes[k], false);
            aligned_case(a, align_sizes[k], true);
        }
}

Test(malloc_api, aligned_alloc_up_to_16MiB, .init = init, .timeout = 60) {
    aligned_range(8, 16 * MiB);
}

/* Alignments of a whole segment and more: the block may not sit in the same
 * 32 MiB segment as its huge header. */
Test(malloc_api, aligned_alloc_32MiB, .init = init, .timeout = 60) {
    aligned_range(32 * MiB, 32 * MiB);
}

Test(malloc_api, aligned_alloc_64MiB, .init = init, .timeout = 60) {
    aligned_range(64 * MiB, 64 * MiB);
}

/* 0 and 1 bytes at an alignment of a segment or more: a huge mapping for
 * (almost) nothing. Its room was rounded from the size's highest bit, and
 * 0 has none (clz(0): the fuzzer's UBSan build caught it, session 21). */
Test(malloc_api, aligned_alloc_of_0_and_1_bytes_at_huge_alignments, .init = init) {
    for (size_t a = 32 * MiB; a <= 64 * MiB; a *= 2)
        for (size_t size = 0; size <= 1; size++) {
            void *p = lull_aligned_alloc(a, size);
            cr_assert_not_null(p, "aligned_alloc(%zu MiB, %zu): errno %d", a >> 20, size, errno);
            cr_assert_eq((uintptr_t)p % a, 0);
            cr_assert(lull_owns(p));
            cr_assert_geq(lull_usable_size(p), size);
            cr_assert_leq(lull_usable_size(p), 64 * KiB, "%zu bytes in %zu", size,
                          lull_usable_size(p));
            if (size) *(volatile char *)p = 1;
            lull_free(p);
        }
}

/* The block of aligned_alloc(32 MiB, 0) lies a segment after its header:
 * its mapping must reach past it. With no room at all the pointer was the
 * mapping's end, the next 32 MiB boundary, where the next huge malloc put
 * its header: the free of the first then read the neighbour's header and
 * aborted ("inside a huge block"), session 22's review. */
Test(malloc_api, a_huge_aligned_block_of_0_bytes_lies_inside_its_mapping, .init = init) {
    for (size_t a = 32 * MiB; a <= 64 * MiB; a *= 2) {
        char *p = lull_aligned_alloc(a, 0);
        cr_assert_not_null(p);
        char *next = lull_malloc(40 * MiB);
        cr_assert_not_null(next);
        next[0] = 1;
        *(volatile char *)p = 1; /* the block's room: a page at least */
        lull_free(p);
        lull_free(next);
    }
}

Test(malloc_api, aligned_small_blocks_share_spans, .init = init) {
    /* many small aligned blocks: all aligned, none overlapping */
    enum { N = 512 };
    void *p[N];
    for (int i = 0; i < N; i++) {
        size_t a = (size_t)16 << (i % 8); /* 16 .. 2048 */
        p[i] = lull_aligned_alloc(a, (size_t)(i % 300) + 1);
        cr_assert_not_null(p[i]);
        cr_assert_eq((uintptr_t)p[i] % a, 0);
        memset(p[i], i & 0xff, (size_t)(i % 300) + 1);
    }
    for (int i = 0; i < N; i++) {
        cr_assert_eq(((unsigned char *)p[i])[0], (unsigned char)(i & 0xff));
        cr_assert_eq(((unsigned char *)p[i])[i % 300], (unsigned char)(i & 0xff));
        lull_free(p[i]);
    }
}

Test(malloc_api, bad_alignments_are_einval, .init = init) {
    static const size_t bad_posix[] = {0, 1, 2, 4, 3, 12, 24, 48, 100, 4097};
    for (size_t k = 0; k < sizeof bad_posix / sizeof bad_posix[0]; k++) {
        void *p = (void *)1;
        cr_assert_eq(lull_posix_memalign(&p, bad_posix[k], 64), EINVAL, "alignment %zu",
                     bad_posix[k]);
        cr_assert_eq(p, (void *)1, "posix_memalign wrote *out on EINVAL");
    }
    static const size_t bad_aligned[] = {0, 3, 12, 24, 48, 100, 4097, (SIZE_MAX >> 1) + 2};
    for (size_t k = 0; k < sizeof bad_aligned / sizeof bad_aligned[0]; k++) {
        errno = 0;
        cr_assert_null(lull_aligned_alloc(bad_aligned[k], 64), "alignment %zu", bad_aligned[k]);
        cr_assert_eq(errno, EINVAL, "alignment %zu: errno %d", bad_aligned[k], errno);
    }
    /* 1, 2 and 4 are powers of two: fine for aligned_alloc */
    for (size_t a = 1; a <= 4; a *= 2) {
        void *p = lull_aligned_alloc(a, 10);
        cr_assert_not_null(p);
        lull_free(p);
    }
}

#ifdef LULL_OVERRIDE
#include <malloc.h> /* memalign: lull's only when it replaces the malloc family */
#endif

/* Alignments no allocation can have fail at once, with each function's
 * errno: memalign rounds an alignment that is not a power of two up (as
 * glibc's does), and one above 2^63 has no power of two to round to: EINVAL
 * (glibc: the same). aligned_alloc and posix_memalign take powers of two
 * only: EINVAL for the others, ENOMEM for a power of two too large to serve.
 * (The round-up used to wrap to 0 and loop for ever: the timeout ends such a
 * run.) */
Test(malloc_api, alignments_above_2_63_fail_at_once, .init = init, .timeout = 30) {
    const size_t top = (SIZE_MAX >> 1) + 1; /* 2^63 */
    static const struct {
        size_t alignment;
        int aligned_alloc_errno, memalign_errno;
    } cases[] = {
        {SIZE_MAX, EINVAL, EINVAL},
        {((SIZE_MAX >> 1) + 1) | 1, EINVAL, EINVAL},
        {SIZE_MAX - 4096, EINVAL, EINVAL},
        {(SIZE_MAX >> 1) + 1, ENOMEM, ENOMEM},
        {((SIZE_MAX >> 1) + 1) / 2 + 1, EINVAL, ENOMEM}, /* memalign: rounded up to 2^63 */
        {((SIZE_MAX >> 1) + 1) / 2, ENOMEM, ENOMEM},
        {(size_t)1 << 47, ENOMEM, ENOMEM},
    };
    cr_assert_eq(cases[3].alignment, top);
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        size_t a = cases[k].alignment;
        errno = 0;
        void *p = lull_aligned_alloc(a, 64);
        cr_assert_null(p, "aligned_alloc(%#zx, 64) = %p", a, p);
        cr_assert_eq(errno, cases[k].aligned_alloc_errno, "aligned_alloc(%#zx): errno %d", a,
                     errno);
        void *q = (void *)1;
        int rc = lull_posix_memalign(&q, a, 64);
        cr_assert_eq(rc, cases[k].aligned_alloc_errno, "posix_memalign(%#zx) = %d", a, rc);
        cr_assert_eq(q, (void *)1, "posix_memalign(%#zx) wrote *out on failure", a);
#ifdef LULL_OVERRIDE
        errno = 0;
        p = memalign(a, 64);
        cr_assert_null(p, "memalign(%#zx, 64) = %p", a, p);
        cr_assert_eq(errno, cases[k].memalign_errno, "memalign(%#zx): errno %d", a, errno);
#endif
    }
#ifdef LULL_OVERRIDE
    /* the memalign tried above is lull's, and still rounds up */
    void *m = memalign(3000, 100);
    cr_assert_not_null(m);
    cr_assert(lull_owns(m));
    cr_assert_eq((uintptr_t)m % 4096, 0);
    free(m);
#endif
}

/* valloc and pvalloc align to the kernel's page, whatever it is (16 or
 * 64 KiB on some arm64, ppc64 and loongarch kernels), not to lull's own
 * 4 KiB unit; pvalloc gives whole pages, one for 0 bytes. */
Test(malloc_api, valloc_and_pvalloc_use_the_kernels_page_size, .init = init) {
#ifdef LULL_OVERRIDE
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    cr_assert_eq(lull_os_page_size(), page);
    size_t sizes[] = {0, 1, 100, page - 1, page, page + 1, 3 * page + 5, 300 * KiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        size_t s = sizes[k];
        void *v = valloc(s);
        cr_assert_not_null(v, "valloc(%zu)", s);
        cr_assert(lull_owns(v), "valloc(%zu) is not lull's", s);
        cr_assert_eq((uintptr_t)v % page, 0, "valloc(%zu) = %p, not %zu-aligned", s, v, page);
        cr_assert_geq(lull_usable_size(v), s);
        free(v);
        void *p = pvalloc(s);
        cr_assert_not_null(p, "pvalloc(%zu)", s);
        cr_assert(lull_owns(p), "pvalloc(%zu) is not lull's", s);
        cr_assert_eq((uintptr_t)p % page, 0, "pvalloc(%zu) = %p, not %zu-aligned", s, p, page);
        size_t whole = s ? (s + page - 1) / page * page : page;
        size_t usable = lull_usable_size(p);
        cr_assert_geq(usable, whole, "pvalloc(%zu): %zu usable bytes, not whole %zu-byte pages", s,
                      usable, page);
        ((volatile char *)p)[usable - 1] = 1; /* usable means writable */
        free(p);
    }
    errno = 0;
    cr_assert_null(pvalloc(SIZE_MAX - page / 2));
    cr_assert_eq(errno, ENOMEM);
#else
    cr_skip_test("valloc and pvalloc are lull's only with LULL_OVERRIDE");
#endif
}

/* ---- usable size, sized free, ownership, version ------------------------ */

Test(malloc_api, usable_size_is_the_class_size_for_small_blocks, .init = init) {
    cr_assert_eq(lull_usable_size(NULL), 0);
    for (size_t s = 1; s <= LULL_SMALL_MAX; s += (s < 2048 ? 1 : s / 16)) {
        void *p = lull_malloc(s);
        cr_assert_not_null(p);
        cr_assert_eq(lull_usable_size(p), lull_classes[lull_class_of(s)].block_size, "size %zu", s);
        lull_free(p);
    }
    for (size_t s = LULL_SMALL_MAX + 1; s <= 40 * MiB; s = s * 3 / 2 + 12345) {
        void *p = lull_malloc(s);
        cr_assert_not_null(p, "malloc(%zu)", s);
        size_t u = lull_usable_size(p);
        cr_assert_geq(u, s, "size %zu: usable %zu", s, u);
        ((volatile char *)p)[u - 1] = 1; /* usable means writable */
        lull_free(p);
    }
}

Test(malloc_api, free_null_and_free_sized_with_the_right_size, .init = init) {
    lull_free(NULL);
    lull_free_sized(NULL, 100);
    lull_free_aligned_sized(NULL, 64, 100);
    static const size_t sizes[] = {1,     8,         9,         100,     1024,     1025,
                                   70000, 512 * KiB, 513 * KiB, 2 * MiB, 16 * MiB, 17 * MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        void *p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        lull_free_sized(p, sizes[k]);
        p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        lull_free_sized(p, lull_usable_size(p)); /* the usable size is fine too */
        p = lull_aligned_alloc(256, sizes[k]);
        cr_assert_not_null(p);
        lull_free_aligned_sized(p, 256, sizes[k]);
    }
    /* a freed block of each kind is reused: the sized frees really freed */
    void *a = lull_malloc(100);
    lull_free_sized(a, 100);
    complete_last_free();
    void *b = lull_malloc(100);
    cr_assert_eq(a, b);
    lull_free_sized(b, 100);
}

static int a_global;

Test(malloc_api, owns_our_blocks_and_nothing_else, .init = init) {
    int on_stack;
    void *small = lull_malloc(32), *large = lull_malloc(2 * MiB), *huge = lull_malloc(20 * MiB);
    cr_assert(lull_owns(small));
    cr_assert(lull_owns(large));
    cr_assert(lull_owns(huge));
    cr_assert(lull_owns((char *)large + MiB));
    cr_assert_not(lull_owns(NULL));
    cr_assert_not(lull_owns(&on_stack));
    cr_assert_not(lull_owns(&a_global));
    cr_assert_not(lull_owns((void *)lull_owns));
    void *m = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(m, MAP_FAILED);
    cr_assert_not(lull_owns(m));
    munmap(m, 4096);
    lull_free(small);
    lull_free(large);
    lull_free(huge);
}

Test(malloc_api, version_matches_the_header) {
    cr_assert_str_eq(lull_version(), LULL_VERSION_STRING);
    char want[32];
    snprintf(want, sizeof want, "%d.%d.%d", LULL_VERSION_MAJOR, LULL_VERSION_MINOR,
             LULL_VERSION_PATCH);
    cr_assert_str_eq(lull_version(), want);
}

/* ---- huge blocks: their data is never taken for metadata ---------------- */

/* free() finds a block's span descriptor through the address mask before it
 * knows whether the 32 MiB boundary starts a segment or a huge header; for a
 * huge block that descriptor must lie in the header, not in the caller's
 * data. */
Test(malloc_api, a_huge_blocks_span_descriptor_is_in_its_header, .init = init) {
    static const size_t aligns[] = {8, 4096, 65536, MiB, 8 * MiB, 16 * MiB};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        char *p = lull_aligned_alloc(aligns[k], 20 * MiB);
        cr_assert_not_null(p);
        lull_segment *seg = lull_segment_of(p);
        cr_assert_eq(seg->magic, LULL_HUGE_MAGIC);
        lull_span *d =
            &lull_span_table_of(seg)->slices[((uintptr_t)p - (uintptr_t)seg) >> LULL_SLICE_SHIFT];
        cr_assert_leq((uintptr_t)(d + 1), (uintptr_t)p,
                      "alignment %zu: free(%p) reads the descriptor at %p, inside the block",
                      aligns[k], p, (void *)d);
        lull_free(p);
    }
}

/* The same, as behaviour: a huge block full of pointer-sized data (here, a
 * value the freeing thread's own heap has) is freed and given back. Run in a
 * child: if free() takes the data for a span, it corrupts the heap. */
Test(malloc_api, a_huge_block_full_of_data_is_freed_and_unmapped, .init = init) {
    lull_set_purge_delay_ms(0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        /* not kept for reuse: the unmap is what this checks */
        if (!lull_configure("huge_cache_mb", "0")) _exit(4);
        uintptr_t *p = lull_malloc(20 * MiB);
        if (!p) _exit(2);
        for (size_t i = 0; i < (256 * KiB) / sizeof *p; i++)
            p[i] = (uintptr_t)lull_tl_heap;
        lull_free(p);
        if (!lull_reclaim_now()) _exit(3);
        lull_reclaim_now();
        _exit(lull_owns(p) ? 1 : 0);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
    cr_assert_neq(WEXITSTATUS(status), 1, "the freed huge block was never unmapped");
    cr_assert_eq(WEXITSTATUS(status), 0);
}

/* ---- mmap failure ------------------------------------------------------- */

Test(malloc_api, mmap_failure_gives_enomem_and_existing_segments_still_serve, .init = init) {
    /* a segment exists: some small blocks live in it */
    void *keep = lull_malloc(48);
    cr_assert_not_null(keep);
    lull_fault_arm(LULL_FAULT_MMAP, -1);
    errno = 0;
    void *huge = lull_malloc(64 * MiB);
    int huge_errno = errno;
    errno = 0;
    void *huge_aligned = lull_aligned_alloc(16 * MiB, 1);
    int huge_aligned_errno = errno;
    /* a class this thread has not used needs a new span: the existing
     * segment has free slices */
    void *small = lull_malloc(3000);
    void *small2 = lull_calloc(1, 200 * KiB);
    /* large blocks until no segment has room: NULL + ENOMEM, never a crash */
    void *large[64];
    int n_large = 0, large_errno = 0;
    while (n_large < 64) {
        errno = 0;
        void *p = lull_malloc(16 * MiB);
        if (!p) {
            large_errno = errno;
            break;
        }
        large[n_large++] = p;
    }
    lull_fault_arm(LULL_FAULT_MMAP, 0);

    cr_assert_null(huge);
    cr_assert_eq(huge_errno, ENOMEM);
    cr_assert_null(huge_aligned);
    cr_assert_eq(huge_aligned_errno, ENOMEM);
    cr_assert_not_null(small, "a small malloc failed although the segment had room");
    cr_assert_not_null(small2);
    cr_assert(all_zero(small2, 200 * KiB));
    cr_assert_lt(n_large, 64, "16 MiB blocks kept coming although mmap fails");
    cr_assert_eq(large_errno, ENOMEM);
    for (int i = 0; i < n_large; i++)
        lull_free(large[i]);

    /* disarmed: everything works again */
    huge = lull_malloc(64 * MiB);
    cr_assert_not_null(huge);
    void *big = lull_malloc(16 * MiB);
    cr_assert_not_null(big);
    lull_free(big);
    lull_free(huge);
    lull_free(small);
    lull_free(small2);
    lull_free(keep);
}
