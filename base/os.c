/* Memory from the kernel; see os.h. Segments are placed with
 * MAP_FIXED_NOREPLACE at consecutive 32 MiB boundaries of a region found at
 * start, so that no request thread ever has to trim a misaligned mapping
 * with munmap, neighbouring segments merge into few VMAs, and they form the
 * segment run that free() tests first (base/segment_map.h). Huge blocks
 * are placed the same way in a region above it. */
#include "base/os.h"
#include "base/fault.h"
#include "base/segment_map.h"
#include "base/types.h"

#include <errno.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <unistd.h>
#include "base/linux_compat.h"

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* Where mappings are placed: the next 32 MiB boundary to try, and the
 * region's bounds if the hint starts over at `lo` when it passes `hi` (hi 0:
 * it never does). Hints never come back otherwise, but for the boundaries
 * of a mapping the kernel refused with ENOMEM (a limit, to huge.c; also
 * one past the address space's end), which the next mapping tries again. */
typedef struct placement {
    _Atomic uintptr_t next;
    uintptr_t lo, hi;
} placement;

/* Segments: from the region's start up, for good (segments are never
 * unmapped). */
static placement segments_place;
/* Huge blocks, in a region of their own above the segments': placed among
 * them, the first huge block would end the segment run
 * (base/segment_map.h), and every later segment would be found through
 * the map. Their hint starts over: the boundaries freed blocks left are
 * there to be taken again (a live block's are refused, EEXIST, and the
 * next are tried). */
static placement huge_place;
/* Address space mapped only to align a segment (the fallback below): never
 * touched; counted by the statistics as purged. */
_Atomic uint64_t lull_os_slack_bytes;

size_t lull_os_page_size(void) {
    /* the auxiliary vector, read once (no system call, no allocation) */
    static _Atomic size_t page_size;
    size_t ps = atomic_load_explicit(&page_size, memory_order_relaxed);
    if (!ps) {
        unsigned long v = getauxval(AT_PAGESZ);
        ps = v ? (size_t)v : LULL_PAGE_SIZE;
        atomic_store_explicit(&page_size, ps, memory_order_relaxed);
    }
    return ps;
}

static uintptr_t align_up(uintptr_t x, size_t a) {
    return (x + a - 1) & ~(uintptr_t)(a - 1);
}

void lull_os_init(void) {
    if (atomic_load(&segments_place.next)) return;
    /* Find where the kernel would put large mappings, then leave a gap so
     * that its own top-down placement does not run into our segments. */
    size_t probe_len = 2 * LULL_SEGMENT_SIZE;
    void *p = mmap(NULL, probe_len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    uintptr_t start = (uintptr_t)0x200000000000ULL; /* 32 TiB */
    uintptr_t segments_room = (uintptr_t)1 << 39;   /* before the huge blocks' region */
    if (p != MAP_FAILED) {
        munmap(p, probe_len); /* start-up only, before any request thread exists */
#if defined(__SANITIZE_THREAD__)
        /* ThreadSanitizer allows application memory only close below the
         * mmap base: a hint further down is rewritten to address 0 */
        uintptr_t tib = (uintptr_t)1 << 36;
#else
        uintptr_t tib = (uintptr_t)1 << 40;
#endif
        if ((uintptr_t)p > start + tib) {
            start = (uintptr_t)p - tib; /* under mmap_base */
            segments_room = tib / 2;
        } else if ((uintptr_t)p < start) { /* a small address space (valgrind, 39-bit VA) */
            start = (uintptr_t)p + ((uintptr_t)1 << 36);
            segments_room = (uintptr_t)1 << 35;
        } else {
            segments_room = ((uintptr_t)p - start) / 2;
        }
    }
    uintptr_t expected = 0, first = align_up(start, LULL_SEGMENT_SIZE);
    if (atomic_compare_exchange_strong(&segments_place.next, &expected, first)) {
        huge_place.lo = align_up(first + segments_room, LULL_SEGMENT_SIZE);
        huge_place.hi = huge_place.lo + segments_room;
        atomic_store(&huge_place.next, huge_place.lo);
        lull_segment_run_init(first);
    }
}

static const int map_prot = PROT_READ | PROT_WRITE;
static const int map_flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;

/* len bytes at the next free 32 MiB boundaries of a range (the segments'
 * or the huge blocks'), whose next hint advances by `range`, placed so that
 * the mapping's start plus `at` is a multiple of `align` (a power of two of
 * 32 MiB or more; range holds len and that shift); at most `attempts`
 * boundaries are tried. NULL with errno EEXIST when they were taken (or an
 * old kernel ignored MAP_FIXED_NOREPLACE and placed the mapping off a
 * boundary: that one is never touched, never unmapped, and counted as
 * slack) or refused with ENOMEM (a limit, or a range past the address
 * space's end: the caller maps anywhere then, which fails too at a limit),
 * ENOMEM for any other error. */
static void *map_at_next_boundary(placement *place, size_t len, size_t range, int attempts,
                                  size_t align, size_t at) {
    for (int attempt = 0; attempt < attempts; attempt++) {
        uintptr_t taken = atomic_fetch_add(&place->next, range);
        if (place->hi && taken + range > place->hi) {
            /* past the region: start over (a thread that raced this one
             * past it starts over too, and one of the two finds the first
             * boundary taken) */
            uintptr_t expected = taken + range;
            atomic_compare_exchange_strong(&place->next, &expected, place->lo + range);
            taken = place->lo;
        }
        uintptr_t hint = align_up(taken + at, align) - at;
        void *p = mmap((void *)hint, len, map_prot, map_flags | MAP_FIXED_NOREPLACE, -1, 0);
        if (p == (void *)hint) return p;
        if (p != MAP_FAILED) {
            if ((((uintptr_t)p + at) & (align - 1)) == 0) return p;
            atomic_fetch_add(&lull_os_slack_bytes, len);
            errno = EEXIST;
            return NULL;
        }
        /* ENOMEM: an address space limit, or a range past the end of the
         * address space (a block of a TiB or more, from a boundary near the
         * region's top): the caller's mapping anywhere answers both, and
         * fails too under the limit. The boundaries go back to the hint
         * (unless another thread took later ones meanwhile): kept, each
         * malloc refused at a limit left a hole in the segments' region,
         * the segment run ended at the first (base/segment_map.h: every
         * later segment was freed through the map), and a program that
         * retried walked the hint into the huge blocks' region
         * (tests/test_segment_run_enomem.c) */
        if (errno == ENOMEM) {
            uintptr_t expected = taken + range;
            atomic_compare_exchange_strong(&place->next, &expected, taken);
            break;
        }
        if (errno != EEXIST) {
            errno = ENOMEM;
            return NULL;
        }
    }
    errno = EEXIST;
    return NULL;
}

void *lull_os_segment_map(void) {
    if (lull_fault(LULL_FAULT_MMAP)) {
        errno = ENOMEM;
        return NULL;
    }
    /* boundaries found taken on the way (EEXIST) are no failure of the
     * caller's malloc(): a segment made leaves errno as it was */
    int saved = errno;
    void *seg = map_at_next_boundary(&segments_place, LULL_SEGMENT_SIZE, LULL_SEGMENT_SIZE, 16,
                                     LULL_SEGMENT_SIZE, 0);
    if (seg) {
        errno = saved;
        return seg;
    }
    /* The hinted region is taken or refused (valgrind keeps its own map of
     * the address space): let the kernel choose, twice the size, and use
     * the aligned segment inside. The rest is never touched and never
     * unmapped (no munmap on a request thread). */
    void *p = mmap(NULL, 2 * LULL_SEGMENT_SIZE, map_prot, map_flags, -1, 0);
    if (p == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    uintptr_t aligned = align_up((uintptr_t)p, LULL_SEGMENT_SIZE);
    atomic_fetch_add(&lull_os_slack_bytes, LULL_SEGMENT_SIZE);
    atomic_store(&segments_place.next, aligned + LULL_SEGMENT_SIZE);
    errno = saved;
    return (void *)aligned;
}

void lull_os_huge_region(uintptr_t *lo, uintptr_t *hi) {
    *lo = huge_place.lo;
    *hi = huge_place.hi;
}

void *lull_os_huge_map_aligned(size_t len, size_t align, size_t at) {
    if (lull_fault(LULL_FAULT_MMAP) || len > LULL_MAX_ALLOC + LULL_SEGMENT_SIZE ||
        align > LULL_MAX_ALLOC) {
        errno = ENOMEM;
        return NULL;
    }
    /* the boundaries up to the next one after the block stay unmapped: room
     * to grow in place (lull_huge_grow_in_place), and no address space or
     * commit charge; a larger alignment's shift takes range, not mapping */
    size_t range = align_up(len, LULL_SEGMENT_SIZE) + (align > LULL_SEGMENT_SIZE ? align : 0);
    return map_at_next_boundary(&huge_place, len, range, 4, align, at);
}

void *lull_os_huge_map(size_t len, void **base, size_t *map_len) {
    if (lull_fault(LULL_FAULT_MMAP) || len > LULL_MAX_ALLOC + LULL_SEGMENT_SIZE) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = mmap(NULL, len, map_prot, map_flags, -1, 0);
    if (p == MAP_FAILED) {
        errno = ENOMEM;
        return NULL;
    }
    *base = p;
    *map_len = len;
    return p;
}

int lull_os_collapse(void *addr, size_t len) {
    if (lull_fault(LULL_FAULT_COLLAPSE)) return EAGAIN;
    return madvise(addr, len, MADV_COLLAPSE) == 0 ? 0 : errno;
}

int lull_os_populate(void *addr, size_t len) {
    return madvise(addr, len, MADV_POPULATE_WRITE) == 0 ? 0 : errno;
}

void lull_os_advise_huge(void *addr, size_t len) {
    (void)madvise(addr, len, MADV_HUGEPAGE); /* a hint: nothing to do if refused */
}
