/* The exported entry points: the lull_* API, and (LULL_OVERRIDE builds) the
 * standard malloc family under its own names, so that -llull and
 * LD_PRELOAD=liblull.so both replace the system allocator. */
#include "lull.h"
#include "src/alloc.h"
#include "src/entry_text.h"
#include "src/profile.h"
#include "numa/huge.h"
#include "base/message.h"
#include "base/os.h"

#include <errno.h>
#include <string.h>

void *lull_calloc_generic(size_t size);

LULL_EXPORT LULL_ENTRY_TEXT void *lull_malloc(size_t size) {
    return lull_malloc_inline(size);
}

LULL_EXPORT void lull_free(void *p) {
    lull_free_inline(p);
}

LULL_EXPORT LULL_ENTRY_TEXT void *lull_calloc(size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    if (total <= 1024) {
        void *p = lull_malloc_inline(total);
        if (p) memset(p, 0, total);
        return p;
    }
    return lull_calloc_generic(total);
}

LULL_EXPORT size_t lull_usable_size(const void *p) {
    if (!p) return 0;
    lull_segment *seg = lull_segment_of(p);
    if (lull_segment_map_has((uintptr_t)seg) && seg->magic == LULL_SEGMENT_MAGIC) {
        lull_span *span = lull_span_of(seg, p);
        if (span->kind == LULL_SPAN_SMALL) return span->block_size;
    }
    return lull_usable_generic(p);
}

LULL_EXPORT bool lull_owns(const void *p) {
    if (!p) return false;
    lull_segment *seg = lull_segment_of(p);
    return lull_segment_map_has((uintptr_t)seg) || lull_aligned_huge_of(p) != NULL;
}

/* A shrinking realloc keeps p, a live block, for `size` (its move found no
 * memory): the block records the size, which a sized free with it then
 * passes (lull_check_sized_free; it accepts down to half the block's
 * usable size otherwise). A large or huge block only: a small one records
 * no size, and is not kept. */
static bool keep_shrunk(void *p, size_t size) {
    lull_huge *h = lull_huge_block_of(p);
    if (h) {
        /* its tail goes back all the same: kept whole, a 40 MiB block
         * shrunk to 512 KiB at the heap limit held all 40 MiB there */
        if (!lull_huge_shrink_in_place(h, size)) h->size = size;
        return true;
    }
    lull_span *span = lull_span_of(lull_segment_of(p), p);
    if (span->kind != LULL_SPAN_LARGE) return false;
    span->requested = size;
    return true;
}

/* realloc() kept p: counted as a move is, the free of the old block and
 * the allocation of the new one, so that malloc_count counts every realloc
 * that returns a block and malloc_count - free_count stays the blocks
 * live. A block kept was in neither count, and a program whose reallocs
 * grew in place showed no allocation calls (tests/test_realloc_counted.c). */
static void count_kept(void) {
    lull_heap *h = lull_tl_heap;
    if (h != &lull_heap_empty) { /* the owner's counters: plain stores */
        h->allocs++;
        h->frees++;
        return;
    }
    atomic_fetch_add_explicit(&lull_other_allocs, 1, memory_order_relaxed);
    atomic_fetch_add_explicit(&lull_other_frees, 1, memory_order_relaxed);
}

/* realloc() kept p for `size` bytes: a sampled block's sample now counts
 * that size in use (a sample keeps the size it was taken with otherwise,
 * and inuse_space showed a 40 MiB block grown in place to 100 MiB as 40
 * MiB: tests/test_profile_realloc.c). Only large and huge blocks can be
 * sampled (a sample lives in a large span of its own, profile.h): a small
 * block's realloc takes no lock. */
static void resized_in_place(void *p, size_t size) {
    if (__builtin_expect(lull_profile_interval_now() == 0, 1)) return;
    if (!lull_huge_block_of(p)) {
        lull_span *span = lull_span_of(lull_segment_of(p), p);
        if (__atomic_load_n(&span->kind, __ATOMIC_ACQUIRE) != LULL_SPAN_LARGE || !span->sampled)
            return;
    }
    lull_profile_resized(p, size);
}

LULL_EXPORT LULL_ENTRY_TEXT void *lull_realloc(void *p, size_t size) {
    if (!p) return lull_malloc_inline(size);
    if (size == 0) { /* as glibc: free and return NULL */
        lull_free_inline(p);
        return NULL;
    }
    /* keeping or growing a pointer inside a block, or a freed block, would
     * hand out memory that is not the caller's (another block's, or one
     * the next malloc takes too) */
    size_t usable = lull_check_live_block("realloc()", p);
    if (size > usable && size > LULL_LARGE_MAX) {
        lull_huge *h = lull_huge_block_of(p);
        if (h && lull_huge_grow_in_place(h, size)) {
            h->size = size;
            resized_in_place(p, size);
            count_kept();
            return p;
        }
    }
    /* keep the block when the new size fits and does not waste over half;
     * a smaller one moves (a copy of at most half the block), so the old
     * block's memory goes back like any freed block's: a large or huge block
     * kept whole for a small size stayed resident for good */
    if (size <= usable && size >= usable / 2) {
        resized_in_place(p, size);
        count_kept();
        return p;
    }
    /* a huge block shrinks where it is and its tail goes to the reclaim
     * thread: the copy to a new block (its mapping, its page faults) took
     * 120-320 ms for a 23 MiB block */
    if (size < usable && size >= LULL_HUGE_SHRINK_MIN) {
        lull_huge *h = lull_huge_block_of(p);
        if (h && lull_huge_shrink_in_place(h, size)) {
            resized_in_place(p, size);
            count_kept();
            return p;
        }
    }
    int saved = errno;
    void *q = lull_malloc_inline(size);
    if (!q) {
        /* a shrink that found no memory for the smaller block keeps the
         * block it has, which holds the size: at the heap limit a NULL
         * here failed the very call that would give memory back
         * (tests/test_realloc_shrink_limit.c) */
        if (size <= usable && keep_shrunk(p, size)) {
            resized_in_place(p, size);
            count_kept();
            errno = saved;
            return p;
        }
        return NULL; /* p is untouched, as the standard asks */
    }
    memcpy(q, p, size < usable ? size : usable);
    lull_free_inline(p);
    return q;
}

LULL_EXPORT LULL_ENTRY_TEXT void *lull_reallocarray(void *p, size_t count, size_t size) {
    size_t total;
    if (__builtin_mul_overflow(count, size, &total)) {
        errno = ENOMEM;
        return NULL;
    }
    return lull_realloc(p, total);
}

static bool power_of_two(size_t x) {
    return x && !(x & (x - 1));
}

LULL_EXPORT LULL_ENTRY_TEXT void *lull_aligned_alloc(size_t alignment, size_t size) {
    if (!power_of_two(alignment)) {
        errno = EINVAL;
        return NULL;
    }
    if (alignment <= 8) return lull_malloc_inline(size);
    return lull_malloc_aligned_generic(alignment, size);
}

LULL_EXPORT LULL_ENTRY_TEXT int lull_posix_memalign(void **out, size_t alignment, size_t size) {
    if (!power_of_two(alignment) || alignment % sizeof(void *)) return EINVAL;
    /* the error is the result: errno stays the caller's (GCC keeps it in a
     * register across the call) */
    int caller_errno = errno;
    void *p = lull_aligned_alloc(alignment, size);
    if (!p) {
        errno = caller_errno;
        return ENOMEM;
    }
    *out = p;
    return 0;
}

__attribute__((noinline)) void lull_free_sized_slow(const char *who, void *p, size_t size) {
    if (!p) return;
    lull_check_sized_free(who, p, 1, size);
    lull_free_inline(p);
}

LULL_EXPORT void lull_free_sized(void *p, size_t size) {
    lull_free_sized_inline("free_sized()", p, size);
}

LULL_EXPORT void lull_free_aligned_sized(void *p, size_t alignment, size_t size) {
    if (!p) return;
    lull_check_sized_free("free_aligned_sized()", p, alignment <= 8 ? 1 : alignment, size);
    lull_free_inline(p);
}

LULL_EXPORT const char *lull_version(void) {
    return LULL_VERSION_STRING;
}

#ifdef LULL_OVERRIDE
#define EXPORT_AS(name) __attribute__((visibility("default"), alias(#name)))
/* the aliases are the same functions: their attributes need not repeat */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmissing-attributes"
#endif
LULL_EXPORT void *malloc(size_t size) EXPORT_AS(lull_malloc);
LULL_EXPORT void free(void *p) EXPORT_AS(lull_free);
LULL_EXPORT void *calloc(size_t count, size_t size) EXPORT_AS(lull_calloc);
LULL_EXPORT void *realloc(void *p, size_t size) EXPORT_AS(lull_realloc);
LULL_EXPORT void *reallocarray(void *p, size_t count, size_t size) EXPORT_AS(lull_reallocarray);
LULL_EXPORT int posix_memalign(void **out, size_t alignment, size_t size)
    EXPORT_AS(lull_posix_memalign);
LULL_EXPORT size_t malloc_usable_size(void *p) EXPORT_AS(lull_usable_size);
LULL_EXPORT void free_sized(void *p, size_t size) EXPORT_AS(lull_free_sized);
LULL_EXPORT void free_aligned_sized(void *p, size_t alignment, size_t size)
    EXPORT_AS(lull_free_aligned_sized);

/* glibc's malloc calls (src/glibc_malloc.c, an archive member of its own in
 * liblull.a) come with malloc: a program that links liblull.a and calls
 * none of them itself still exports them (the linker exports a definition
 * that libc.so has too, as it does malloc's), so that its plugins and
 * libraries reach lull's. Without this reference the member came only with
 * a call of the program's own: a dlopen'ed plugin's malloc_trim(0) trimmed
 * glibc's empty arena and said 0, and its mallinfo2() read glibc's figures
 * (tests/test_glibc_calls_exported.c). */
LULL_EXPORT int malloc_trim(size_t pad);
__attribute__((used)) static int (*const with_glibc_malloc_calls)(size_t) = malloc_trim;

LULL_EXPORT LULL_ENTRY_TEXT void *aligned_alloc(size_t alignment, size_t size) {
    return lull_aligned_alloc(alignment, size);
}

LULL_EXPORT LULL_ENTRY_TEXT void *memalign(size_t alignment, size_t size) {
    /* glibc's memalign accepts any alignment and rounds it up; above 2^63
     * there is no power of two to round to (and the loop would wrap to 0):
     * EINVAL, as glibc's */
    if (alignment > SIZE_MAX / 2 + 1) {
        errno = EINVAL;
        return NULL;
    }
    if (!power_of_two(alignment)) {
        size_t a = 1;
        while (a < alignment)
            a <<= 1;
        alignment = a;
    }
    return lull_aligned_alloc(alignment, size);
}

/* valloc and pvalloc: the kernel's page, not lull's 4 KiB unit (16 or
 * 64 KiB on some arm64, ppc64 and loongarch kernels). */
LULL_EXPORT LULL_ENTRY_TEXT void *valloc(size_t size) {
    return lull_aligned_alloc(lull_os_page_size(), size);
}

/* Whole pages: pvalloc(0) is one, as tcmalloc's (glibc's is 1 byte). */
LULL_EXPORT LULL_ENTRY_TEXT void *pvalloc(size_t size) {
    size_t page = lull_os_page_size(), rounded;
    if (__builtin_add_overflow(size ? size : 1, page - 1, &rounded)) {
        errno = ENOMEM;
        return NULL;
    }
    return lull_aligned_alloc(page, rounded & ~(page - 1));
}

/* glibc's __libc_* names of the family (glibc 2.36 exports these seven at
 * GLIBC_2.2.5), as mimalloc, tcmalloc and jemalloc define them: code
 * written for glibc (an old malloc hook's wrapper, a runtime, a profiler)
 * calls them and mixes their blocks with malloc's, so they must be one
 * allocator's. When they were glibc's, __libc_free(malloc(100)) handed
 * lull's block to glibc's free ("free(): invalid pointer", abort), and
 * free(__libc_malloc(100)) glibc's block to lull's. Here, in malloc's
 * archive member, so that a program linked with liblull.a has them (and
 * exports them to its plugins) as it has malloc
 * (tests/test_glibc_libc_names.c, tests/test_glibc_calls_exported.c). */
LULL_EXPORT void *__libc_malloc(size_t size) EXPORT_AS(lull_malloc);
LULL_EXPORT void __libc_free(void *p) EXPORT_AS(lull_free);
LULL_EXPORT void *__libc_calloc(size_t count, size_t size) EXPORT_AS(lull_calloc);
LULL_EXPORT void *__libc_realloc(void *p, size_t size) EXPORT_AS(lull_realloc);
LULL_EXPORT void *__libc_memalign(size_t alignment, size_t size) EXPORT_AS(memalign);
LULL_EXPORT void *__libc_valloc(size_t size) EXPORT_AS(valloc);
LULL_EXPORT void *__libc_pvalloc(size_t size) EXPORT_AS(pvalloc);
/* cfree, glibc's old name of free: since glibc 2.26 only a compat symbol
 * (cfree@GLIBC_2.2.5) that binaries built before then still call; an
 * unversioned definition here matches their versioned reference. It was
 * glibc's, which aborted on lull's block ("free(): invalid pointer"). */
LULL_EXPORT void cfree(void *p) EXPORT_AS(lull_free);
#endif
