/* The slow paths of malloc and free: refilling a class from its spans,
 * taking spans from the arena, large and huge blocks, remote frees, and
 * the checks that turn an invalid or double free into a clear abort. */
#include "src/alloc.h"
#include "src/entry_text.h"
#include "numa/arena.h"
#include "base/config.h"
#include "numa/home_arena.h"
#include "numa/huge.h"
#include "src/init.h"
#include "base/message.h"
#include "base/prefetch.h"
#include "base/race.h"
#include "reclaim/reclaim.h"
#include "src/outbox.h"
#include "src/reuse.h"
#include "src/profile.h"
#include "src/span_park.h"

#include <errno.h>
#include <string.h>

/* Carve up to a page's worth of never-used blocks into the free list: memory
 * is touched only as it is handed out. */
void lull_span_extend(lull_span *s) {
    uint32_t left = s->capacity - s->carved;
    uint32_t n = (uint32_t)(LULL_PAGE_SIZE / s->block_size);
    if (n < 1) n = 1;
    if (n > left) n = left;
    uint8_t *start = lull_span_start(s) + (size_t)s->carved * s->block_size;
    lull_block *first = (lull_block *)start, *b = first;
    for (uint32_t i = 1; i < n; i++) {
        lull_block *next = (lull_block *)((uint8_t *)b + s->block_size);
        lull_block_set_next(b, next);
        b = next;
    }
    lull_block_set_next(b, s->free);
    s->free = first;
    s->carved += n;
}

/* The thread may have moved to another node since its heap last took a
 * span: new spans come from the node it runs on now (an rseq read, no
 * system call). */
static void follow_home_node(lull_heap *h) {
    if (lull_arena_count < 2 || h->node_pinned) return;
    int node = lull_home_node();
    if (node != h->node) {
        h->node = node;
        h->arena = &lull_arenas[node];
    }
}

static lull_span *span_new(lull_heap *h, unsigned c) {
    const lull_class_info *ci = &lull_classes[c];
    /* the thread's own held remote frees go out when it takes memory, so
     * that a thread that allocates now and then holds none for long. Not
     * at every refill: sending part-full messages there cost larson-live
     * 15 % (31 against 37 Mops/s) */
    if (h->outbox_pending) lull_outbox_flush(h);
    follow_home_node(h);
    bool zeroed;
    lull_span *s = lull_arena_alloc_span(h->arena, ci->span_slices, &zeroed);
    if (!s) return NULL;
    s->free = NULL;
    s->park_at = 0;
    s->parked_pages = 0;
    s->parking = 0;
    atomic_store_explicit(&s->parks, 0, memory_order_relaxed);
    s->in_full = 0;
    s->sampled = 0;
    s->used = 0;
    s->capacity = ci->capacity;
    s->carved = 0;
    s->block_size = ci->block_size;
    s->size_class = (uint8_t)c;
    s->kind = LULL_SPAN_SMALL;
    s->zeroed = zeroed;
    s->kept = 0;
    s->block_offset = 0;
    s->div_magic = ci->div_magic;
    s->start_magic = (uint64_t)(uintptr_t)lull_span_start(s) * ci->div_magic;
    s->remote_next = NULL;
    atomic_store_explicit(&s->thread_free, 0, memory_order_relaxed);
    atomic_store_explicit(&s->remote_suspect, 0, memory_order_relaxed);
    /* publish the owner last: a free() that sees this heap sees the span */
    atomic_store_explicit(&s->heap, h, memory_order_release);
    h->spans_taken++;
    return s;
}

/* Can malloc take a block of s (a span of the class's queue) now? Its
 * remote frees, parked pages and uncarved blocks are brought in first. If
 * not, it is full: it waits on the heap's full list for a free. */
static bool refill_from(lull_heap *h, lull_span_queue *q, lull_span *s) {
    if (!s->free) lull_span_collect(s);
    /* its parked pages before new ones: what is still resident costs no
     * fault, and the span's footprint does not grow; a parking span
     * carves nothing (the next carve's page never parks, but its blocks
     * would be on no bitmap) */
    if (!s->free) lull_span_unpark(s, true);
    if (!s->free && !s->parking && s->carved < s->capacity) lull_span_extend(s);
    if (s->free) return true;
    /* a page being purged kept it parking: it stays queued (the full
     * list is left only by a free into the span, and an empty span gets
     * none), and a later refill takes it back */
    if (s->parking && lull_span_has_free(s)) return false;
    lull_heap_queue_remove(q, s);
    lull_span_set_in_full(s, true);
    lull_span_park_arm(s);
    lull_heap_queue_push_front(&h->full, s);
    return false;
}

/* A span with fewer blocks free than REFILL_ENOUGH gives malloc too few to
 * pay for its refill, in a class with REFILL_BACK_SPANS spans or more
 * queued (a large heap, whose descriptors are cold) */
#define REFILL_ENOUGH 4
#define REFILL_BACK_SPANS 8

/* From the front: the span a free made non-full last, whose block is still
 * in the cache, and which packs the live blocks into the fullest spans
 * (the emptier ones drain, park their pages and go back). But in a large
 * class a span with fewer than REFILL_ENOUGH blocks free has malloc back
 * here at once: then the back span is taken (the one that came free
 * longest ago, with the most time to gather frees). Front only, a large
 * heap of nearly full spans refilled at almost every malloc, one block a
 * span: bench_throughput st with 300,000 live blocks took 101 ns an
 * operation instead of 61 (docs/architecture.md). Makes a span of class c
 * with a free block current, or takes a new one. */
lull_span *lull_class_refill(lull_heap *h, unsigned c) {
    lull_heap_collect_remote(h);
    lull_span_queue *q = &h->queue[c];
    for (lull_span *s = q->head, *next; s; s = next) {
        next = s->next;
        if (!refill_from(h, q, s)) continue; /* full: on the full list now */
        if (q->count >= REFILL_BACK_SPANS && s->capacity - lull_span_used(s) < REFILL_ENOUGH) {
            /* the back's full spans go to the full list on the way */
            for (lull_span *t; (t = q->tail) != s;) {
                if (refill_from(h, q, t)) {
                    s = t;
                    break;
                }
                if (q->tail == t) break; /* stays queued, parking */
            }
        }
        if (s != q->head) {
            lull_heap_queue_remove(q, s);
            lull_heap_queue_push_front(q, s);
        }
        lull_heap_set_current(h, c, s);
        return s;
    }
    lull_span *s = span_new(h, c);
    if (!s) {
        lull_heap_set_current(h, c, q->head ? q->head : &lull_span_empty);
        return NULL;
    }
    lull_span_extend(s);
    lull_heap_queue_push_front(q, s);
    lull_heap_set_current(h, c, s);
    return s;
}

/* A span's fields for one large block of `size` bytes, aligned to
 * `alignment` (at least a slice), in its `slices` slices. */
static void *large_span_init(lull_span *s, size_t size, size_t alignment, size_t slices,
                             bool zeroed) {
    uint8_t *start = lull_span_start(s);
    uintptr_t block = ((uintptr_t)start + alignment - 1) & ~(uintptr_t)(alignment - 1);
    s->block_offset = (uint32_t)(block - (uintptr_t)start);
    s->block_size = (uint32_t)(slices << LULL_SLICE_SHIFT);
    s->capacity = 1;
    /* class 0, which no size has: the sized free's fast path (alloc.h)
     * compares the class of its size with this, and a class left by a
     * small span on these slices let a wrong size through unchecked */
    s->size_class = 0;
    s->park_at = 0;
    s->parked_pages = 0;
    s->parking = 0;
    atomic_store_explicit(&s->parks, 0, memory_order_relaxed);
    s->in_full = 0;
    s->sampled = 0;
    s->used = 1;
    s->requested = size;
    s->zeroed = zeroed;
    s->free = NULL;
    atomic_store_explicit(&s->heap, NULL, memory_order_relaxed);
    atomic_store_explicit(&s->thread_free, 0, memory_order_relaxed);
    __atomic_store_n(&s->kind, LULL_SPAN_LARGE, __ATOMIC_RELEASE);
    return (void *)block;
}

static void *large_alloc(lull_heap *h, size_t size, size_t alignment, bool optional) {
    size_t pad = alignment > LULL_SLICE_SIZE ? alignment - LULL_SLICE_SIZE : 0;
    /* at least one byte past the alignment pad: a 0-byte block must still lie
     * inside its span */
    size_t slices = ((size ? size : 1) + pad + LULL_SLICE_SIZE - 1) >> LULL_SLICE_SHIFT;
    bool zeroed;
    follow_home_node(h);
    lull_span *s = optional ? lull_arena_try_alloc_span(h->arena, (unsigned)slices, &zeroed)
                            : lull_arena_alloc_span(h->arena, (unsigned)slices, &zeroed);
    if (!s) return NULL;
    return large_span_init(s, size, alignment, slices, zeroed);
}

void *lull_large_alloc(lull_heap *h, size_t size, size_t alignment) {
    return large_alloc(h, size, alignment, false);
}

void *lull_large_alloc_sample(lull_heap *h, size_t size) {
    return large_alloc(h, size, LULL_SLICE_SIZE, true);
}

void *lull_large_alloc_again(lull_span *s, size_t size) {
    return large_span_init(s, size, LULL_SLICE_SIZE, 1, false);
}

/* A block of class c from its current span, refilled if it has none;
 * NULL when no span can be had. */
static inline void *take_from_span(lull_heap *h, unsigned c) {
    lull_span *s = h->current[c];
    if (!s->free && !(s = lull_class_refill(h, c))) return NULL;
    lull_block *b = s->free;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    if (__builtin_expect(b == h->deferred, 0)) lull_fatal_deferred_double_free(b);
#endif
    s->free = lull_block_next(b);
    s->used++;
    h->allocs++;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    b->next_encoded = 0; /* see lull_malloc_inline */
#endif
    return b;
}

static void *alloc_in_heap(lull_heap *h, size_t size, size_t alignment, bool *zeroed) {
    *zeroed = false;
    if (size <= LULL_SMALL_MAX && alignment <= LULL_SLICE_SIZE) {
        size_t asked = size < alignment ? alignment : size;
        unsigned c = lull_class_of(asked);
        while (c < lull_class_count && lull_classes[c].block_size % alignment)
            c++;
        if (c < lull_class_count) {
            if (lull_reuse_listed(h, c)) {
                if (h->reuse[c].free) return lull_reuse_take(h, c);
                if (h->reuse_other[c]) return lull_reuse_take_other(h, c);
            }
            if (__builtin_expect(h->profile != NULL, 0)) {
                void *b = lull_profile_alloc_small(h, c, size, zeroed);
                if (!b) goto oom;
                return b;
            }
            void *b = take_from_span(h, c);
            if (!b) goto oom;
            return b;
        }
    }
    /* a start point (reclaim.h), as a span taken from an arena is: a
     * program whose allocations were all aligned huge blocks (through
     * neither malloc's slow path nor an arena) never started the thread,
     * and none of its freed blocks was ever unmapped (30 2 MiB aligned
     * blocks of 64 MiB, each freed: 1.9 GiB resident, glibc 66 MiB) */
    lull_reclaim_start_point();
    /* memory taken, as span_new() does for small blocks: a thread that
     * frees others' small blocks and then allocates only large or huge ones
     * held its part-full messages until it collected or exited */
    if (h->outbox_pending) lull_outbox_flush(h);
    /* and what others freed of this heap's blocks comes back first, as at
     * a refill: the spans it empties go back to the arena, whose slices the
     * new block may take; over the heap limit, a large or huge block was
     * refused while the room it needed waited in the inbox */
    lull_heap_collect_remote(h);
    void *p;
    bool sample = h->profile && lull_profile_large_due(h, size);
    if (size <= LULL_LARGE_MAX && alignment <= LULL_SEGMENT_SIZE / 4) {
        p = lull_large_alloc(h, size, alignment < LULL_SLICE_SIZE ? LULL_SLICE_SIZE : alignment);
        if (p) {
            lull_span *s = lull_span_of(lull_segment_of(p), p);
            *zeroed = s->zeroed;
            s->sampled = sample;
        }
    } else {
        follow_home_node(h);
        p = lull_huge_alloc(size, alignment, zeroed, h->node);
    }
    if (p) {
        h->allocs++;
        if (sample) lull_profile_sampled(p, size, size);
        return p;
    }
oom:
    errno = ENOMEM;
    return NULL;
}

__attribute__((always_inline)) static inline void *alloc_anywhere(size_t size, size_t alignment,
                                                                  bool *zeroed) {
    if (__builtin_expect(lull_tl_heap == &lull_heap_empty, 0)) {
        if (lull_heap_thread_done()) {
            /* an exiting thread, after lull's heap destructor: see heap.c */
            lull_heap *late = lull_heap_late_acquire();
            if (!late) {
                errno = ENOMEM;
                return NULL;
            }
            void *p = alloc_in_heap(late, size, alignment, zeroed);
            lull_heap_late_release();
            return p;
        }
        /* a thread's first allocation may be the process's: set up the core */
        lull_ensure_init();
    }
    lull_heap *h = lull_heap_get_or_create();
    if (!h) return NULL;
    return alloc_in_heap(h, size, alignment, zeroed);
}

/* always inline: the CFA of the function it is in (the entry's slow path)
 * is where the heap profile's stacks start */
__attribute__((always_inline)) static inline void *alloc_zeroable(size_t size, size_t alignment,
                                                                  bool *zeroed) {
    /* A thread without a heap yet may be making the process's first
     * allocation, which reads the configuration: profiling may be on when
     * it samples, so it sets the boundary too (without it, the first
     * allocation's sample had lull_profile_sampled and alloc_in_heap on
     * top: test_profile_first_alloc) */
    lull_heap *h = lull_tl_heap;
    if (__builtin_expect(lull_profile_interval_now() == 0, 1) && h != &lull_heap_empty)
        return alloc_anywhere(size, alignment, zeroed);
    /* a window ran out (lull_profile_next_window): no sample there */
    if (alignment == 1 && size <= 1024 && h->profile) {
        void *b = lull_profile_next_window(h, lull_class_of(size));
        if (b) {
            *zeroed = false;
            return b;
        }
    }
    /* An allocation inside this one (pthread_create's, when the reclaim
     * thread starts on the way) sets its own boundary, deeper: the outer
     * one is put back when it returns, so that a sample taken after it
     * starts where this allocation's frames end (test_heap_profile saw
     * alloc_in_heap on top of a sampled stack one run in three) */
    uintptr_t outer = lull_profile_boundary;
    lull_profile_boundary = (uintptr_t)__builtin_dwarf_cfa();
    void *p = alloc_anywhere(size, alignment, zeroed);
    lull_profile_boundary = outer;
    return p;
}

/* Everything lull_malloc_slow's common case leaves. In the entry section
 * (src/entry_text.h), with lull_malloc_slow: where the compiler makes no
 * tail call of it (the sanitizer builds), lull_malloc_slow's frame is above
 * the profile's boundary, which alloc_zeroable sets, and the heap profile
 * named it as the allocating function (test_heap_profile under ASan). */
LULL_ENTRY_TEXT __attribute__((noinline)) static void *malloc_slower(size_t size) {
    bool zeroed;
    if (size > LULL_MAX_ALLOC) {
        errno = ENOMEM;
        return NULL;
    }
    return alloc_zeroable(size, 1, &zeroed);
}

/* A block this thread freed into another heap's span first (reuse.h): the
 * heap is set up (the empty heap's lists are empty). Without a frame: the
 * rest of the slow path saves four registers. A list that direct[] led to
 * and that ran dry: direct[] leads back to the class's span. */
LULL_ENTRY_TEXT void *lull_malloc_slow(size_t size) {
    /* frees only want a deferred reclaim thread; an allocation starts it
     * (one relaxed load once it runs; reclaim.h) */
    lull_reclaim_start_point();
    if (__builtin_expect(size <= 1024, 1)) {
        lull_heap *h = lull_tl_heap;
        unsigned c = lull_small_class_of[(size + 7) >> 3];
        bool listed = lull_reuse_listed(h, c);
        if (listed && h->reuse[c].free) return lull_reuse_take(h, c);
        if (h->reuse_direct[c]) lull_reuse_point_back(h, c);
        if (listed && h->reuse_other[c]) return lull_reuse_take_other(h, c);
        /* the class's span ran dry, the common case left: the refill
         * without the general path's checks (an allocation before the
         * thread's first, the heap profile, alignment and size classes:
         * about 60 instructions a refill, callgrind) */
        if (h != &lull_heap_empty && !h->profile && lull_profile_interval_now() == 0) {
            void *b = take_from_span(h, c);
            if (!b) errno = ENOMEM;
            return b;
        }
    }
    return malloc_slower(size);
}

void *lull_malloc_aligned_generic(size_t alignment, size_t size) {
    bool zeroed;
    if (size > LULL_MAX_ALLOC || alignment > LULL_MAX_ALLOC) {
        errno = ENOMEM;
        return NULL;
    }
    return alloc_zeroable(size, alignment, &zeroed);
}

void *lull_calloc_generic(size_t size) {
    bool zeroed;
    if (size > LULL_MAX_ALLOC) {
        errno = ENOMEM;
        return NULL;
    }
    void *p = alloc_zeroable(size, 1, &zeroed);
    if (p && !zeroed) memset(p, 0, size);
    return p;
}

/* free ----------------------------------------------------------------- */

/* Frees of large and huge blocks, and remote small frees by a thread that
 * has no heap (any thread; the others are counted on the freeing heap). */
_Atomic uint64_t lull_other_frees;
_Atomic uint64_t lull_other_allocs; /* realloc's kept blocks on a thread with no heap */

static bool kept_by_someone(const lull_block *b, const lull_span *span);

void lull_free_deferred_repeat(const lull_block *b) {
    lull_fatal_deferred_double_free(b);
}

void lull_heap_free_deferred(lull_heap *h) {
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    lull_block *b = h->deferred;
    if (b == &h->deferred_none) return;
    lull_span *span = h->deferred_span;
    lull_heap_deferred_clear(h);
    lull_free_owned_now(b, span, h);
#else
    (void)h;
#endif
}

void lull_free_local_checked(lull_block *b, lull_span *span, lull_heap *h) {
    if (b == &h->deferred_none) return; /* the deferred slot was empty */
    if (lull_block_in_message(b) || kept_by_someone(b, span))
        lull_fatal("free(): double free of %p (freed by another thread, then by its owner thread)",
                   (void *)b);
    /* a block another thread freed first is on the remote list: bring that
     * list in, so that the walk below sees it */
    lull_span_collect(span);
    /* a block cut into the heap profile's window is free there too: linked
     * again, the window and the span's list both handed it out */
    if (lull_span_free_list_has(span, b) || lull_profile_window_has(h, span, b))
        lull_fatal("free(): double free of %p (block of %u bytes)", (void *)b, span->block_size);
    lull_block_set_next(b, span->free);
    span->free = b;
    h->frees++;
    if (lull_span_put_back_one(span)) lull_free_local_tail(h, span);
}

void lull_free_local_tail(lull_heap *h, lull_span *span) {
    if (span->parking) lull_span_park_absorb(span); /* the block freed */
    if (lull_span_in_full(span)) {
        lull_heap_queue_remove(&h->full, span);
        lull_span_set_in_full(span, false);
        lull_heap_queue_push_front(&h->queue[span->size_class], span);
        if (h->current[span->size_class] == &lull_span_empty || !h->current[span->size_class]->free)
            lull_heap_set_current(h, span->size_class, span);
    }
    if (lull_span_used(span) == 0)
        lull_heap_span_empty(h, span);
    else if (span->park_at && !(span->used & ~LULL_SPAN_SLOW_FREE))
        lull_span_park_start(span);
}

/* Is b on one of the span's free lists? Asked by a thread that does not own
 * the span, when the block it frees looks free already (its first word
 * decodes to an address in its own segment, which a live block's data all
 * but never does): the owner's local list and the remote list are walked as
 * they are at this moment, without the owner's help. The walk races the
 * owner's pops and pushes, so each link is checked to be a block start in
 * this span before it is followed (a stale link ends the walk; the
 * segment's memory stays mapped, so a read never faults), and at most
 * `capacity` links are followed. A block that is found was free at the
 * moment its link was read: this free is a double free. TSan is told not to
 * watch these reads: they are racy by design, and nothing is written. */
__attribute__((no_sanitize("thread"))) static bool
free_list_has(const lull_span *span, const lull_block *first, const lull_block *b) {
    const uint8_t *start = lull_span_start(span);
    const uint8_t *end = start + (size_t)span->capacity * span->block_size;
    uint32_t limit = span->capacity;
    for (const lull_block *f = first; f && limit--;) {
        if ((const uint8_t *)f < start || (const uint8_t *)f >= end ||
            lull_block_misaligned(span, f))
            return false;
        if (f == b) return true;
        uintptr_t word = __atomic_load_n(&f->next_encoded, __ATOMIC_RELAXED);
        f = (const lull_block *)(word ^ lull_link_key(f));
    }
    return false;
}

/* Is b (of `span`, looking free) on the reuse list (src/reuse.h) of the
 * heap its second word names? True only if b was found linked there: a
 * block malloc's fast path handed out again keeps the name of its last
 * keeper, whose list no longer has it. The keeper writes its list while
 * this walks it (a block popped under the walk is written by its new user,
 * and its link read here may be any word): each link is checked to lie in
 * b's segment (a list holds one segment's blocks, and a segment stays
 * mapped) and to be word-aligned, as every block start is, before it is
 * followed, so that the word read lies in the segment and never faults
 * (the segment is aligned to its size; a link into its last 7 bytes read
 * past its end, unmapped after the newest segment: tests/test_kept_walk.c).
 * At most the bound's count are followed. TSan is told not to watch these reads: they are racy by
 * design, and nothing is written. */
__attribute__((no_sanitize("thread"))) static bool kept_by_someone(const lull_block *b,
                                                                   const lull_span *span) {
    /* a block of one word (the 8-byte class) is never kept (reuse.h), and
     * its second word is its neighbour's, or past its segment's end:
     * unmapped after the newest segment's last block */
    if (span->block_size < 2 * sizeof(uintptr_t)) return false;
    uintptr_t word = __atomic_load_n(&(&b->next_encoded)[1], __ATOMIC_RELAXED);
    const lull_heap *keeper = (const lull_heap *)(word ^ lull_link_key(b));
    if (span->size_class >= LULL_CLASSES || !lull_heap_is_one(keeper)) return false;
    const lull_span *list = &keeper->reuse[span->size_class];
    const lull_block *f = __atomic_load_n(&list->free, __ATOMIC_RELAXED);
    for (unsigned n = 0; f && n <= LULL_REUSE_MAX_BLOCKS; n++) {
        if (lull_segment_of(f) != lull_segment_of(b) || (uintptr_t)f % sizeof(uintptr_t))
            return false;
        if (f == b) return true;
        uintptr_t link = __atomic_load_n(&f->next_encoded, __ATOMIC_RELAXED);
        f = (const lull_block *)(link ^ lull_link_key(f));
    }
    return false;
}

__attribute__((no_sanitize("thread"))) static void check_remote_double_free(lull_span *span,
                                                                            lull_block *b) {
    if (lull_block_in_message(b) || kept_by_someone(b, span)) lull_fatal_remote_double_free(b);
    lull_block *local = __atomic_load_n(&span->free, __ATOMIC_RELAXED);
    if (free_list_has(span, local, b))
        lull_fatal("free(): double free of %p (freed by its owner thread, then by another thread)",
                   (void *)b);
    uintptr_t remote = atomic_load_explicit(&span->thread_free, memory_order_acquire);
    if (free_list_has(span, lull_remote_head(remote), b)) lull_fatal_remote_double_free(b);
    /* not found: a live block whose data looked like a link, or a free that
     * races its twin; the owner's collection checks the list once more */
    atomic_store_explicit(&span->remote_suspect, 1, memory_order_relaxed);
}

/* The walks of check_remote_double_free, without its aborts (alloc.h). */
__attribute__((no_sanitize("thread"))) bool lull_small_block_is_free(lull_span *span,
                                                                     const lull_block *b) {
    if (lull_block_in_message(b) || kept_by_someone(b, span)) return true;
    if (free_list_has(span, __atomic_load_n(&span->free, __ATOMIC_RELAXED), b)) return true;
    uintptr_t remote = atomic_load_explicit(&span->thread_free, memory_order_acquire);
    return free_list_has(span, lull_remote_head(remote), b);
}

size_t lull_check_live_block(const char *who, void *p) {
    lull_segment *seg = lull_segment_of(p);
    lull_huge *huge = lull_aligned_huge_of(p);
    if (!huge && !lull_segment_map_has((uintptr_t)seg))
        lull_fatal("%s: invalid pointer %p (not allocated by lull)", who, p);
    if (!huge && seg->magic == LULL_HUGE_MAGIC) huge = (lull_huge *)seg;
    if (huge) {
        char *start = (char *)huge + huge->block_offset;
        if ((char *)p != start)
            lull_fatal("%s: invalid pointer %p (inside a huge block at %p)", who, p, (void *)start);
        if (atomic_load_explicit(&huge->freed, memory_order_acquire))
            lull_fatal("%s: %p was freed (huge block)", who, p);
        return huge->usable;
    }
    lull_span *span = lull_span_of(seg, p);
    uint8_t kind = __atomic_load_n(&span->kind, __ATOMIC_ACQUIRE);
    if (kind == LULL_SPAN_LARGE) {
        uint8_t *start = lull_span_start(span) + span->block_offset;
        if ((uint8_t *)p != start)
            lull_fatal("%s: invalid pointer %p (inside a large block at %p)", who, p,
                       (void *)start);
        return span->block_size - span->block_offset;
    }
    if (kind != LULL_SPAN_SMALL)
        lull_fatal("%s: invalid pointer %p (no block there: freed, or never handed out)", who, p);
    if (lull_block_misaligned(span, p)) lull_fatal_misaligned_by(who, p, span);
    /* the thread's last free waits in its heap, neither linked nor marked
     * (src/alloc.h, the deferred free) */
    lull_block *b = p;
    if (b == lull_tl_heap->deferred)
        lull_fatal("%s: %p was freed (block of %u bytes)", who, p, span->block_size);
    /* a parking span's free blocks are in its bitmap, on no list
     * (src/span_park.h), and their first word is a stale link or, on a
     * purged page, 0: the walks below miss them. The owner reads the
     * bitmap; another thread asks, as free() does, whether the block is on
     * a page given back (which holds free blocks only) */
    if (atomic_load_explicit(&span->parks, memory_order_relaxed) &&
        (lull_span_owned_by(span, lull_tl_heap) ? lull_span_parking_has(span, b)
                                                : lull_span_block_on_parked_page(span, b)))
        lull_fatal("%s: %p was freed (block of %u bytes)", who, p, span->block_size);
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    /* (without the checks malloc leaves a popped block's stale link, which
     * looks free: every realloc would walk the lists) */
    if (lull_block_looks_free(b) &&
        (lull_small_block_is_free(span, b) || (lull_span_owned_by(span, lull_tl_heap) &&
                                               lull_profile_window_has(lull_tl_heap, span, b))))
        lull_fatal("%s: %p was freed (block of %u bytes)", who, p, span->block_size);
#endif
    return span->block_size;
}

/* The block onto the span's list; the span onto its owner's remote_spans
 * if this CAS set the bit. */
static void push_on_span_list(lull_block *b, lull_span *span, lull_heap *owner) {
    LULL_RACE_POINT(LULL_RACE_REMOTE_PUSH);
    uintptr_t old = atomic_load_explicit(&span->thread_free, memory_order_relaxed);
    do {
        lull_block *head = lull_remote_head(old);
        if (__builtin_expect(head == b, 0)) /* still first on the list: freed twice in a row */
            lull_fatal_remote_double_free(b);
        lull_block_set_next(b, head);
        /* release: the owner's collection sees b's link; acquire: when this
         * CAS sets the bit, the owner's pop that cleared it (and its write of
         * remote_next) happened before the push below */
    } while (!atomic_compare_exchange_weak_explicit(&span->thread_free, &old,
                                                    (uintptr_t)b | LULL_REMOTE_QUEUED,
                                                    memory_order_acq_rel, memory_order_relaxed));
    if (old & LULL_REMOTE_QUEUED) return; /* queued already: the owner will pop it */
    LULL_RACE_POINT(LULL_RACE_REMOTE_QUEUE);
    lull_span *head = atomic_load_explicit(&owner->remote_spans, memory_order_relaxed);
    do {
        span->remote_next = head;
    } while (!atomic_compare_exchange_weak_explicit(&owner->remote_spans, &head, span,
                                                    memory_order_release, memory_order_relaxed));
}

/* The remote-free protocol (docs/architecture.md): one CAS puts the block on
 * the span's list and sets LULL_REMOTE_QUEUED in the same word; the thread
 * whose CAS set the bit, and only that one, then pushes the span on its
 * owner's remote_spans. While the bit is set the owner never releases the
 * span, and only the owner's pop from remote_spans clears it. h, the
 * freeing thread's heap, records the span until the push is done, so that
 * a fork child copied between the CAS and the push finds the span and
 * pushes it (src/heap.c); a thread without a heap holds a lock fork waits
 * for instead. */
static void remote_free(lull_block *b, lull_span *span, lull_heap *owner, lull_heap *h) {
    bool heapless = h == &lull_heap_empty;
    if (heapless)
        lull_heapless_remote_free_lock();
    else /* ordered before the CAS below by its release */
        atomic_store_explicit(&h->remote_queuing, span, memory_order_relaxed);
    push_on_span_list(b, span, owner);
    if (heapless)
        lull_heapless_remote_free_unlock();
    else /* after the push: a fork child copied now finds the span listed */
        atomic_store_explicit(&h->remote_queuing, NULL, memory_order_release);
}

/* A remote free in h's outbox (outbox.h): block b of span, which `owner`
 * owns, of two words at least; h is a thread's heap. The free is counted
 * here, and a message sent gives the abandoned heaps and h's own inbox a
 * collection (reuse.c's send_kept_block_home sends a block kept for reuse,
 * counted when it was kept, and collects nothing: it runs in a flush). */
static inline void send_remote_free(lull_block *b, lull_span *span, lull_heap *h,
                                    lull_heap *owner) {
    /* the owner exited: its heap's blocks come back now, not a reclaim
     * tick later (a chain of threads, each freeing what the last one
     * made) */
    lull_heap *first_sent_to;
    lull_heap *sent_to = lull_outbox_put(h, owner, b, span->block_size, &first_sent_to);
    /* counted by the freeing thread on its own heap: an atomic add on the
     * owner's heap was one more contended line per remote free */
    h->frees++;
    if (__builtin_expect(first_sent_to != NULL, 0)) lull_heap_collect_if_abandoned(first_sent_to);
    if (sent_to) {
        lull_heap_collect_if_abandoned(sent_to);
        /* and what others sent this thread: one that frees but no longer
         * allocates (a thread that handed its blocks to a pool, then frees
         * what the pool gives back) would otherwise hold them until it
         * does. Once a message, and no heap update is under way here. */
        lull_heap_collect_remote(h);
    }
}

/* Everything lull_free_other's common case leaves: huge and large blocks,
 * remote frees that go out in messages or onto the span's list, the
 * checks' slow ends and the errors. */
__attribute__((noinline)) static void free_other_slow(void *p, lull_span *span, lull_heap *h) {
    lull_segment *seg = lull_segment_of(p);
    if (seg->magic == LULL_HUGE_MAGIC) {
        atomic_fetch_add_explicit(&lull_other_frees, 1, memory_order_relaxed);
        if (lull_profile_interval_now()) lull_profile_forget(p); /* if sampled */
        lull_huge_free((lull_huge *)seg, p);
        return;
    }
    uint8_t kind = __atomic_load_n(&span->kind, __ATOMIC_ACQUIRE);
    if (kind == LULL_SPAN_SMALL) {
        lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_acquire);
        if (!owner) lull_fatal("free(): invalid pointer or double free of %p (span not in use)", p);
        lull_block *b = p;
        if (__builtin_expect(lull_block_misaligned(span, p), 0)) lull_fatal_misaligned(p, span);
            /* Freeing writes this word anyway, but reading it first is a miss
             * the store alone would not wait for: the block was last written
             * on its owner's core (a third of bench_throughput --mode
             * larson-live's time is this load). -DLULL_NO_DOUBLE_FREE_CHECK
             * leaves it out here too; without malloc's clearing of the word
             * that build makes, stale links would send most remote frees
             * through the walks below (larson-live 110-206 ns an operation
             * instead of 66-80). */
#ifndef LULL_NO_DOUBLE_FREE_CHECK
        /* a block on a page its parking span gave back is free: a purged
         * one's word is 0, which does not look free; handed out again by
         * this thread, the owner would hand it out too */
        if (atomic_load_explicit(&span->parks, memory_order_relaxed) &&
            lull_span_block_on_parked_page(span, b))
            lull_fatal("free(): double free of %p (block of %u bytes, on a page given back)", p,
                       span->block_size);
        if (__builtin_expect(lull_block_looks_free(b), 0) ||
            __atomic_load_n(&lull_config.strict_checks, __ATOMIC_RELAXED))
#else
        if (__atomic_load_n(&lull_config.strict_checks, __ATOMIC_RELAXED))
#endif
            check_remote_double_free(span, b);
        /* remote frees go out in batches, one message per owner (outbox.h),
         * from the freeing thread's heap: a thread that only frees (a
         * consumer) gets one now. An exiting thread past lull's heap
         * destructor gets none, and blocks too small for a message's two
         * words have none: those go on the span's own list at once. */
        if (h == &lull_heap_empty && !lull_heap_thread_done()) {
            int saved = errno; /* free() leaves errno alone, even when no heap is left */
            h = lull_heap_get_or_create();
            if (!h) h = &lull_heap_empty;
            errno = saved;
        }
        if (h != &lull_heap_empty && span->block_size >= 2 * sizeof(uintptr_t)) {
            send_remote_free(b, span, h, owner);
            return;
        }
        remote_free(b, span, owner, h);
        /* no start point: a free never creates the reclaim thread
         * (reclaim.h: glibc frees thread stacks' TLS vectors holding the
         * lock that pthread_create takes). An abandoned owner, whose
         * remote frees only that thread collects, wanted it when it was
         * abandoned, and the next allocation starts it. */
        if (h != &lull_heap_empty)
            h->frees++;
        else
            atomic_fetch_add_explicit(&lull_other_frees, 1, memory_order_relaxed);
        return;
    }
    if (kind == LULL_SPAN_LARGE) {
        if ((uint8_t *)p != lull_span_start(span) + span->block_offset)
            lull_fatal("free(): invalid pointer %p (inside a large block at %p)", p,
                       (void *)(lull_span_start(span) + span->block_offset));
        uint8_t expected = LULL_SPAN_LARGE;
        if (!__atomic_compare_exchange_n(&span->kind, &expected, LULL_SPAN_NONE, false,
                                         __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
            lull_fatal("free(): double free of %p (large block)", p);
        atomic_fetch_add_explicit(&lull_other_frees, 1, memory_order_relaxed);
        if (span->sampled) {
            lull_profile_forget(p);
            if (lull_profile_keep_span(h, span)) return; /* for this heap's next sample */
        }
        lull_arena_free_span(span); /* wants the reclaim thread (started by an allocation) */
        return;
    }
    lull_fatal("free(): invalid pointer or double free of %p (no block there)", p);
}

/* A small block that lull_free_other's checks passed and that this thread
 * does not keep (its list is full, or the heap's bytes): into the outbox,
 * without the slow path's checks again (bench_throughput prodcons, whose
 * consumer keeps nothing: 200 instructions a free before, 127 with this
 * and the outbox's inline put, callgrind; mimalloc's free takes 73). The
 * empty heap (whose lists read full) and the 8-byte class take the slow
 * path. */
__attribute__((noinline)) static void free_other_send(lull_block *b, lull_span *span,
                                                      lull_heap *h) {
    lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_acquire);
    if (__builtin_expect(
            h == &lull_heap_empty || !owner || span->block_size < 2 * sizeof(uintptr_t), 0)) {
        free_other_slow(b, span, h);
        return;
    }
    send_remote_free(b, span, h, owner);
}

/* A block lull_free_other may keep but for the heap's byte bound, by a
 * count that pops on malloc's fast path left high: counted again, out of
 * line (the call would give lull_free_other a frame). */
__attribute__((noinline)) static void keep_if_recount_fits(void *p, lull_span *span, lull_heap *h) {
    if (!lull_reuse_recount_fits(h, span->block_size)) {
        free_other_slow(p, span, h);
        return;
    }
    h->frees++;
    if (lull_reuse_put(h, p, span)) lull_reuse_point_away(h, span->size_class);
}

/* What lull_free_other's list refused for its segment (the class's list
 * holds another's) or node: the class's second list (reuse.h), else the
 * slow path. Out of line, straight from lull_free_other: through the
 * slow path's checks again, bench_throughput --mode larson (whose blocks
 * lie in two segments) spent 3 % of its instructions there. */
__attribute__((noinline)) static void keep_other_or_slow(void *p, lull_span *span, lull_heap *h) {
    if (h != &lull_heap_empty && lull_reuse_put_other(h, p, span)) {
        h->frees++;
        return;
    }
    free_other_slow(p, span, h);
}

/* The common case first, a small block of another heap's span that this
 * thread keeps for reuse (reuse.h), without a frame: the rest saves six
 * registers (16 instructions a remote free, callgrind, larson-live). A
 * huge block's mapping reads as a segment whose span table is zero: no
 * heap, so it takes the slow path, which looks at the magic. */
void lull_free_other(void *p, lull_span *span, lull_heap *h) {
    lull_block *b = p;
    /* the double-free check reads the block, and every way out of here
     * writes it: another core wrote it last (prefetch.h) */
    lull_prefetch_for_write(b);
    /* a span has a heap only while it is a small span in use (a large or
     * free one has none); the empty heap's lists and the 8-byte class's
     * read full (reuse.h) */
    if (atomic_load_explicit(&span->heap, memory_order_relaxed) != NULL &&
        !lull_block_misaligned(span, p) &&
#ifndef LULL_NO_DOUBLE_FREE_CHECK
        !lull_block_looks_free(b) &&
        /* a parking span's: the slow path looks at the block's pages */
        !atomic_load_explicit(&span->parks, memory_order_relaxed) &&
#endif
        !__atomic_load_n(&lull_config.strict_checks, __ATOMIC_RELAXED)) {
        if (lull_reuse_full(h, span)) {
            free_other_send(b, span, h);
            return;
        }
        if (!lull_reuse_fits(h, b, span)) {
            keep_other_or_slow(p, span, h);
            return;
        }
        if (__builtin_expect(!lull_reuse_bytes_fit(h, span), 0)) {
            if (h->reuse_recount_wait) { /* lull_reuse_recount_fits' wait, without its call */
                h->reuse_recount_wait--;
                free_other_send(b, span, h);
            } else {
                keep_if_recount_fits(p, span, h);
            }
            return;
        }
        h->frees++;
        if (lull_reuse_put(h, b, span)) lull_reuse_point_away(h, span->size_class);
        return;
    }
    free_other_slow(p, span, h);
}

void lull_free_home(void *p, lull_span *span, lull_heap *h) {
    if (atomic_load_explicit(&span->heap, memory_order_relaxed) == h)
        lull_free_inline(p);
    else
        free_other_slow(p, span, h);
}

void lull_free_not_segment(void *p) {
    if (!p) return;
    lull_huge *h = lull_aligned_huge_of(p);
    if (h) {
        atomic_fetch_add_explicit(&lull_other_frees, 1, memory_order_relaxed);
        if (lull_profile_interval_now()) lull_profile_forget(p); /* if sampled */
        lull_huge_free(h, p);
        return;
    }
    lull_fatal("free(): invalid pointer %p (not allocated by lull)", p);
}

size_t lull_usable_generic(const void *p) {
    if (!p) return 0;
    lull_segment *seg = lull_segment_of(p);
    lull_huge *aligned = lull_aligned_huge_of(p);
    if (aligned) return aligned->usable;
    if (!lull_segment_map_has((uintptr_t)seg))
        lull_fatal("malloc_usable_size(): invalid pointer %p (not allocated by lull)", p);
    if (seg->magic == LULL_HUGE_MAGIC) {
        lull_huge *h = (lull_huge *)seg;
        return h->usable;
    }
    lull_span *span = lull_span_of(seg, p);
    uint8_t kind = __atomic_load_n(&span->kind, __ATOMIC_ACQUIRE);
    if (kind == LULL_SPAN_SMALL) return span->block_size;
    if (kind == LULL_SPAN_LARGE) return span->block_size - span->block_offset;
    lull_fatal("malloc_usable_size(): invalid pointer %p (no block there)", p);
}
