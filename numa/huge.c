/* Huge blocks; see huge.h. */
#include "numa/huge.h"
#include "base/config.h"
#include "base/message.h"
#include "base/os.h"
#include "base/resident.h"
#include "base/segment_map.h"
#include "base/fork_exec.h"

#include "numa/arena.h"
#include "base/fault.h"

#include <errno.h>
#include <sys/mman.h>

#ifndef MAP_FIXED_NOREPLACE
#define MAP_FIXED_NOREPLACE 0x100000
#endif

/* both set by the library constructor (base/fork_exec.h) */
LULL_FORK_EXEC_DATA void (*lull_huge_release_hook)(lull_huge *h);
LULL_FORK_EXEC_DATA void (*lull_huge_tail_hook)(void *start, size_t len, size_t dirty, int node);
lull_huge_accounting lull_huge_acct[LULL_MAX_NODES];

static lull_huge_accounting *acct_of(const lull_huge *h) {
    return &lull_huge_acct[h->node >= 0 && h->node < LULL_MAX_NODES ? h->node : 0];
}

#define ACCT_ADD(field, v) atomic_fetch_add_explicit(&a->field, (v), memory_order_relaxed)
#define ACCT_SUB(field, v) atomic_fetch_sub_explicit(&a->field, (v), memory_order_relaxed)

LULL_FORK_EXEC_DATA lull_huge *(*lull_huge_reuse_hook)(size_t size, size_t alignment, int node,
                                                       bool *zeroed);
LULL_FORK_EXEC_DATA uint64_t (*lull_huge_held_hook)(void);

/* May the reclaim thread's forced tick give back address space? */
static bool huge_mappings_held(void) {
    return lull_huge_held_hook && lull_huge_held_hook() != 0;
}

/* Take back a freed huge mapping that fits `size` at `alignment`: no mmap,
 * and no page faults either while it is still dirty. Aligned ones too:
 * asked for at a slice only, a loop of aligned_alloc(1 GiB, 100) and free()
 * mapped a block each time while the freed ones waited for the reclaim
 * thread, 2-10 TiB of address space at its peak. */
static void *huge_reuse(size_t size, size_t alignment, bool *zeroed, int node) {
    if (!lull_huge_reuse_hook) return NULL;
    if (node < 0 || node >= LULL_MAX_NODES) node = 0; /* as acct_of() files it */
    lull_huge *h = lull_huge_reuse_hook(size, alignment, node, zeroed);
    if (!h) return NULL; /* a miss once a mapping is made (huge_alloc) */
    lull_huge_accounting *a = acct_of(h);
    ACCT_SUB(freed, h->usable + LULL_HUGE_HEADER_BYTES);
    ACCT_ADD(live, h->usable);
    ACCT_ADD(metadata, LULL_HUGE_HEADER_BYTES);
    ACCT_ADD(reused, 1);
    h->size = size;
    atomic_store_explicit(&h->freed, 0, memory_order_release);
    return (char *)h + h->block_offset;
}

/* The room a new mapping gets for a block of `size` bytes: rounded up past
 * the size to a granule, 1/32 of the largest power of two at or below it
 * (512 KiB for 16-32 MiB, 1 MiB for 32-64 MiB, ...). A server's buffers
 * differ by a few pages from one request to the next; with each mapping
 * exactly its first block's size, a buffer of 32 MiB and 4 KiB found no
 * room in the cached mapping of a 32 MiB one and was mapped anew, and
 * bench/buffer_cycle (32 MiB +0, +4 and +8 KiB, one at a time) kept three
 * mappings dirty where one serves (docs/status.md, session 21). The tail
 * is address space until a block uses it: a page never touched is never
 * resident. Within the cache's fit rule (lull_huge_fits: an eighth). */
static size_t huge_room_for(size_t size) {
    /* below 32 pages the granule would be under a page: the pages alone
     * (a block of 0 or a few bytes at an alignment of a segment or more;
     * and 0 has no highest bit for clz), and a page at least: with no room
     * a block of 0 bytes was its mapping's end, the next boundary, where
     * the next huge mapping put its header */
    if (size < 32 * LULL_PAGE_SIZE) return LULL_PAGES_OF(size ? size : 1);
    size_t granule = ((size_t)1 << (63 - __builtin_clzll(size))) / 32;
    return (size / granule + 1) * granule;
}

/* The block starts a whole slice (or its alignment) after the header: the
 * span descriptors a free() of an interior pointer reads then lie in the
 * header's own untouched pages, never in the caller's data. *over: the
 * heap limit left no room for a new mapping (base/resident.h); *unmapped:
 * the kernel refused the mapping (an address space limit, or overcommit). */
static void *huge_alloc(size_t size, size_t alignment, bool *zeroed, int node, bool *over,
                        bool *unmapped) {
    *over = false;
    *unmapped = false;
    void *reused = huge_reuse(size, alignment, zeroed, node);
    if (reused) return reused;
    size_t offset = alignment <= LULL_SLICE_SIZE     ? LULL_SLICE_SIZE
                    : alignment <= LULL_SEGMENT_SIZE ? alignment
                                                     : LULL_SEGMENT_SIZE;
    size_t room = huge_room_for(size);
    size_t need = offset + room;
    size_t slack = alignment > LULL_SEGMENT_SIZE ? alignment : LULL_SEGMENT_SIZE;
    /* the header slice and the block are resident once touched (the slack
     * never is, nor the rest of an alignment's offset: huge.h): counted
     * before the mapping exists, given back if it fails */
    size_t resident = LULL_HUGE_HEADER_BYTES + room;
    if (!lull_resident_try_grow(resident)) {
        *over = true;
        return NULL;
    }
    void *base = NULL;
    size_t map_len = need;
    /* At a free 32 MiB boundary, the block's own size and no more. Mapped
     * anywhere with 32 MiB of slack to find the boundary in, a 20 MiB block
     * took 2.6 times its size in address space and commit charge: lull fit
     * 6 of them under an RLIMIT_AS of 400 MB where glibc fit 19. A block
     * aligned past a segment is placed at a boundary its header is a
     * segment below: with the alignment's slack, aligned_alloc(1 GiB, 100)
     * took 2 GiB of address space a block, and a loop of it and free()
     * outran the reclaim thread's unmaps to ENOMEM at 128 TiB (222,804
     * blocks). The slack stays the fallback. */
    bool failed = false;
    if (alignment <= LULL_SEGMENT_SIZE) {
        base = lull_os_huge_map_aligned(need, LULL_SEGMENT_SIZE, 0);
        failed = !base && errno == ENOMEM;
    } else { /* its region's hints may run past the address space: the slack */
        base = lull_os_huge_map_aligned(need, alignment, LULL_SEGMENT_SIZE);
    }
    if (!base && !failed) failed = !lull_os_huge_map(need + slack, &base, &map_len);
    if (failed) {
        lull_resident_sub(resident);
        *unmapped = true;
        return NULL;
    }
    uintptr_t header;
    if (alignment <= LULL_SEGMENT_SIZE) {
        header = ((uintptr_t)base + LULL_SEGMENT_MASK) & ~(uintptr_t)LULL_SEGMENT_MASK;
    } else { /* the block on the alignment, the header a segment below it */
        uintptr_t block = ((uintptr_t)base + LULL_SEGMENT_SIZE + alignment - 1) & ~(alignment - 1);
        header = block - LULL_SEGMENT_SIZE;
    }
    lull_huge *h = (lull_huge *)header;
    /* bind before the first touch (the header write below) */
    if (lull_segment_prepare_hook)
        lull_segment_prepare_hook(h, (size_t)((char *)base + map_len - (char *)h), node);
    h->magic = LULL_HUGE_MAGIC;
    h->map_base = base;
    h->map_len = map_len;
    h->size = size;
    /* the block's pages, not the mapping's end: a fallback mapping's slack
     * after the block is address space only, and the cache's fit rule
     * compares this room with the sizes asked for */
    h->usable = need - offset;
    h->block_offset = (uint32_t)offset;
    h->node = node;
    h->reuse_gap_ms = LULL_HUGE_NO_GAP;
    atomic_store_explicit(&h->freed, 0, memory_order_relaxed);
    lull_huge_accounting *a = acct_of(h);
    ACCT_ADD(mapped, map_len);
    ACCT_ADD(live, h->usable);
    ACCT_ADD(metadata, LULL_HUGE_HEADER_BYTES);
    /* counted here, where the mapping is made: counted at the cache's miss,
     * an aligned block (which takes no freed mapping) was never a miss, and
     * one refused at the heap limit was two (before and after the purge) */
    ACCT_ADD(fresh, 1);
    /* before the header, from its slice to the block, and after the block */
    ACCT_ADD(slack, map_len - LULL_HUGE_HEADER_BYTES - h->usable);
    lull_segment_map_set((uintptr_t)h, true);
    if (offset == LULL_SEGMENT_SIZE)
        lull_map_set(lull_aligned_huge_map, (uintptr_t)h + offset, true);
    *zeroed = true;
    return (char *)h + offset;
}

void *lull_huge_alloc(size_t size, size_t alignment, bool *zeroed, int node) {
    if (size > LULL_MAX_ALLOC || alignment > LULL_MAX_ALLOC) {
        errno = ENOMEM;
        return NULL;
    }
    /* a mapping refused on the way (a boundary taken: EEXIST) and made
     * elsewhere is a success: the caller's errno stays as it was */
    int saved = errno;
    bool over, unmapped;
    void *p = huge_alloc(size, alignment, zeroed, node, &over, &unmapped);
    /* over the heap limit, or refused by the kernel while freed mappings
     * hold address space: the reclaim thread purges and unmaps the cached
     * and queued mappings, this thread waits for it and tries once more:
     * over the limit at most LULL_LIMIT_WAIT_MS, refused until the purge
     * is done (the alternative is NULL, the mappings held are the room).
     * Under an address space limit the cache's mappings may hold the room
     * a new one needs (200 MiB freed, then 250 MiB under a limit 300 MiB
     * above the process: NULL until lull_purge_all, tests/test_huge_cache.c);
     * with none held there is nothing to wait for on the way to ENOMEM */
    bool held = !p && !over && unmapped && huge_mappings_held();
    if (!p && (over ? lull_resident_relieve() : held && lull_resident_relieve_until_done()))
        p = huge_alloc(size, alignment, zeroed, node, &over, &unmapped);
    if (!p && over) lull_resident_refuse();
    errno = p ? saved : ENOMEM;
    return p;
}

void lull_huge_unmap(lull_huge *h, bool block_resident) {
    void *base = h->map_base;
    size_t len = h->map_len;
    lull_resident_sub(LULL_HUGE_HEADER_BYTES + (block_resident ? h->usable : 0));
    lull_huge_accounting *a = acct_of(h);
    ACCT_SUB(freed, h->usable + LULL_HUGE_HEADER_BYTES);
    ACCT_SUB(slack, len - LULL_HUGE_HEADER_BYTES - h->usable);
    ACCT_SUB(mapped, len);
    lull_segment_map_set((uintptr_t)h, false);
    if (h->block_offset == LULL_SEGMENT_SIZE)
        lull_map_set(lull_aligned_huge_map, (uintptr_t)h + LULL_SEGMENT_SIZE, false);
    munmap(base, len);
}

void lull_huge_free(lull_huge *h, void *p) {
    if ((char *)p != (char *)h + h->block_offset)
        lull_fatal("free(): invalid pointer %p (inside a huge block at %p)", p,
                   (void *)((char *)h + h->block_offset));
    int expected = 0;
    if (!atomic_compare_exchange_strong(&h->freed, &expected, 1))
        lull_fatal("free(): double free of huge block %p", p);
    lull_huge_accounting *a = acct_of(h);
    ACCT_ADD(freed, h->usable + LULL_HUGE_HEADER_BYTES);
    ACCT_SUB(live, h->usable);
    ACCT_SUB(metadata, LULL_HUGE_HEADER_BYTES);
    if (lull_huge_release_hook) {
        lull_huge_release_hook(h);
        return;
    }
    /* no reclaim module at all (a build without it): unmap here */
    lull_huge_unmap(h, true);
}

bool lull_huge_grow_in_place(lull_huge *h, size_t size) {
    /* first: block_offset + size (and the round-up below) would wrap for a
     * size near SIZE_MAX and seem to fit; the caller's malloc then fails
     * with ENOMEM and the block stays as it is */
    if (size > LULL_MAX_ALLOC) return false;
    size_t pages = LULL_PAGES_OF(size);
    size_t need = (size_t)h->block_offset + pages;
    size_t have = (size_t)((char *)h->map_base + h->map_len - (char *)h);
    lull_huge_accounting *a = acct_of(h);
    /* the pages the block grows by are resident once touched: within the
     * heap limit, after the reclaim thread's purge if need be, as a new
     * block's are. Refused at once, the caller's copy asked for a new block
     * of the whole size, which needs more room than the growth: a realloc
     * from 40 to 60 MiB failed with 59 MiB free under the limit after that
     * purge, where growing needed 19 */
    size_t grow = pages > h->usable ? pages - h->usable : 0;
    if (grow && !lull_resident_try_grow(grow) &&
        !(lull_resident_relieve() && lull_resident_try_grow(grow)))
        return false;
    if (need > have) {
        /* map the missing tail right after the mapping: an mmap, not an
         * mremap, so the request thread makes no call that the reclaim
         * thread owns; anonymous neighbours with the same flags merge into
         * one VMA */
        size_t extra = (need - have + ((size_t)2 << 20) - 1) & ~(((size_t)2 << 20) - 1);
        char *end = (char *)h->map_base + h->map_len;
        int saved = errno;
        void *p =
            lull_fault(LULL_FAULT_MMAP)
                ? MAP_FAILED
                : mmap(end, extra, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
        if (p != end) { /* EEXIST: something lives there; the caller copies */
            /* and its realloc() succeeds: errno as the caller had it */
            errno = saved;
            lull_resident_sub(grow);
            return false;
        }
        ACCT_ADD(mapped, extra);
        ACCT_ADD(slack, extra);
        h->map_len += extra;
    }
    /* the block grows into the room after it (slack until now) */
    if (pages > h->usable) {
        ACCT_SUB(slack, pages - h->usable);
        ACCT_ADD(live, pages - h->usable);
        h->usable = pages;
    }
    return true;
}

bool lull_huge_shrink_in_place(lull_huge *h, size_t size) {
    if (!lull_huge_tail_hook) return false;
    size_t pages = LULL_PAGES_OF(size);
    if (pages >= h->usable) return false;
    char *cut = (char *)h + h->block_offset + pages;
    size_t len = (size_t)((char *)h->map_base + h->map_len - cut);
    size_t dirty = h->usable - pages; /* the rest of the tail is slack */
    lull_huge_accounting *a = acct_of(h);
    /* live until now, freed (maybe resident) until the reclaim thread's
     * purge and unmap, which subtracts them with the slack and `mapped` */
    ACCT_SUB(live, dirty);
    ACCT_ADD(freed, dirty);
    h->usable = pages;
    h->size = size;
    /* the mapping ends at the cut from now on: a free's unmap, or a
     * growth in place (which finds the tail mapped until it is given
     * back, EEXIST, and copies) */
    h->map_len = (size_t)(cut - (char *)h->map_base);
    if (len) lull_huge_tail_hook(cut, len, dirty, h->node);
    return true;
}

void lull_huge_unmap_tail(void *start, size_t len, size_t dirty, int node) {
    lull_huge_accounting *a = &lull_huge_acct[node >= 0 && node < LULL_MAX_NODES ? node : 0];
    lull_resident_sub(dirty);
    ACCT_SUB(freed, dirty);
    ACCT_SUB(slack, len - dirty);
    ACCT_SUB(mapped, len);
    munmap(start, len);
}
