/* The fast paths of malloc and free, inline so that every exported entry
 * point (malloc, lull_malloc, operator new via malloc...) is a handful of
 * instructions: no lock, no atomic read-modify-write, no system call. */
#ifndef LULL_ALLOC_H
#define LULL_ALLOC_H

#include "base/prefetch.h"
#include "src/free_errors.h"
#include "src/heap.h"
#include "base/segment_map.h"
#include "src/size_class.h"
#include "src/span.h"

/* size first and alone: the fast path's tail call passes it in the register
 * it arrived in (one move fewer per malloc) */
void *lull_malloc_slow(size_t size);
/* Carve up to a page of the span's never-used blocks onto its list. */
void lull_span_extend(lull_span *s);
/* A span of class c with a free block made current, or NULL (no memory). */
lull_span *lull_class_refill(lull_heap *h, unsigned c);
/* A one-block large span for `size` bytes aligned to `alignment` (at
 * least a slice), or NULL. */
void *lull_large_alloc(lull_heap *h, size_t size, size_t alignment);
/* The same, a slice aligned, for the heap profile's sample, which the
 * allocation can do without: over the heap limit NULL at once (no purge
 * waited for, no refusal counted; lull_arena_try_alloc_span). */
void *lull_large_alloc_sample(lull_heap *h, size_t size);
/* The same in s, a one-slice span kept after its large block's free (the
 * heap profile's, lull_profile_keep_span): its memory is not zeroed. */
void *lull_large_alloc_again(lull_span *s, size_t size);
void *lull_malloc_aligned_generic(size_t alignment, size_t size);
/* free() of a block of one of our spans that the calling thread does not
 * own: a remote free, a large block, or an invalid / double free. */
void lull_free_other(void *p, lull_span *span, lull_heap *h);
/* free() of a small block of span `span` by the thread of heap h, never
 * kept for reuse: another heap's block goes out to its owner (defrag). */
void lull_free_home(void *p, lull_span *span, lull_heap *h);
/* A local free whose block looks like it may be free already: aborts if
 * it is on its span's free list (a double free), else frees it. */
void lull_free_local_checked(lull_block *b, lull_span *span, lull_heap *h);
/* After a local free made the span empty, or freed into a full span. */
void lull_free_local_tail(lull_heap *h, lull_span *span);
void lull_free_not_segment(void *p);
/* The statistics' counts made on no heap (stats.c adds them to the heaps'):
 * frees of large and huge blocks, remote small frees by a thread with no
 * heap, and both counts of a block realloc() kept on such a thread. */
extern _Atomic uint64_t lull_other_frees, lull_other_allocs;
/* Aborts, `who` naming the call ("realloc()"), unless p is the start of a
 * block in use: not lull's, inside a block, or a block that is freed (a
 * huge one's flag, the thread's deferred free, a small block found on a
 * free list) all abort naming p. Returns the block's usable size (as
 * lull_usable_size, from the lookups the check made). realloc() asks
 * before it keeps, grows or copies the block. */
size_t lull_check_live_block(const char *who, void *p);
/* Is b, a block of the small span `span` whose first word looks free, on
 * a list of free blocks: in a message, on a reuse list, on its span's
 * local or remote list? Racy for a span another heap owns (a hint); exact
 * for the caller's own span (its remote list is read as it is now). */
bool lull_small_block_is_free(lull_span *span, const lull_block *b);
/* A sized free (alignment 1) past the inline check: the full check, then
 * free(); NULL does nothing. */
void lull_free_sized_slow(const char *who, void *p, size_t size);
size_t lull_usable_generic(const void *p);

/* always inline: every caller is an entry point, whose frame the heap
 * profile skips by its section (src/entry_text.h); a copy of its own (an
 * -O1 or sanitizer build) would be a lull frame on top of every stack */
__attribute__((always_inline)) static inline void *lull_malloc_inline(size_t size) {
    lull_heap *h = lull_tl_heap;
    if (__builtin_expect(size <= 1024, 1)) {
        lull_span *s = h->direct[(size + 7) >> 3];
        lull_block *b = s->free;
        if (__builtin_expect(b != NULL, 1)) {
#ifndef LULL_NO_DOUBLE_FREE_CHECK
            /* free, and freed again since: the deferred free would link it
             * a second time while it is handed out */
            if (__builtin_expect(b == h->deferred, 0)) lull_fatal_deferred_double_free(b);
#endif
            s->free = lull_block_next(b);
            s->used++;
            h->allocs++;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
            b->next_encoded = 0; /* so that its free does not look like a double free */
#endif
            return b;
        }
    }
    return lull_malloc_slow(size);
}

/* The deferred free. The double-free check reads the freed block's first
 * word, and in a heap larger than the caches that load misses on most
 * frees; a load holds the CPU's window until it returns, where a store
 * would wait in the store buffer. So an owner's free keeps its block in
 * the heap (h->deferred; the interior test, which reads no block, done at
 * once) with a prefetch of its line for writing, and checks and links the
 * block the free before kept: its line has had a free's time to come in.
 * The block stays counted in its span's used until then, so nothing but
 * the owner can see the wait. A block freed twice is still seen: the free
 * of the block that waits aborts at once (free(p); free(p)); a block freed
 * again after its first free was linked is on its span's list and waits:
 * the next free finds it linked (lull_free_local_checked), and a malloc
 * that reaches it first compares its pop with the slot
 * (lull_fatal_deferred_double_free). Every walk of the heap's spans and
 * every hand-on of the heap (collection, exit, abandonment, defrag, the
 * heap profile, lull_stats) runs lull_heap_free_deferred() first.
 * Measured in docs/architecture.md. */

/* The free of b found b itself as the deferred free: freed twice in a
 * row. Aborts; not declared noreturn, so that free() jumps to it (a call
 * would give free() a frame: 2 instructions). */
__attribute__((cold)) void lull_free_deferred_repeat(const lull_block *b);

/* Checks, links and counts block b of span, which h owns; the span's
 * state follows (a kept empty span that is its class's current one stays:
 * a thread that mallocs and frees one block in a loop never leaves this
 * path). Always inline: the fast path. */
__attribute__((always_inline)) static inline void
lull_free_owned_now(lull_block *b, lull_span *span, lull_heap *h) {
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    if (__builtin_expect(lull_block_looks_free(b), 0)) {
        lull_free_local_checked(b, span, h);
        return;
    }
#endif
    lull_block_set_next(b, span->free);
    span->free = b;
    h->frees++;
    if (__builtin_expect(lull_span_put_back_one(span), 0) &&
        (span->used != 0 || h->current[span->size_class] != span || !span->kept))
        lull_free_local_tail(h, span);
}

/* free(), and (`sized`) the sized frees of sizes up to 1 KiB: free_sized()
 * and the C++ sized deletes. A sized free compares the class its size asks
 * for with its span's, which it loads anyway: every C++ container's
 * deallocation is a sized delete, and the full check (free_errors.h) on
 * its own made a 32-byte new+delete pair cost 181 instructions instead of
 * 85; this makes it 94 (callgrind). Another class, or a block of no segment, goes to the
 * full check: lull_free_sized_slow() aborts naming `who` unless the size
 * may be the block's. Always inline: a copy that is not would test
 * `sized` at run time, for free() too. */
__attribute__((always_inline)) static inline void lull_free_any(void *p, bool sized,
                                                                const char *who, size_t size) {
    uintptr_t off;
    lull_span *span;
    /* the run first: most pointers are in it (base/segment_map.h), and
     * its span table answers from the offset (numa/span_table.h) */
    if (__builtin_expect(lull_in_segment_run_at(p, &off), 1)) {
        span = lull_run_span_at(off);
    } else {
        lull_segment *seg = lull_segment_of(p);
        if (!lull_segment_map_has((uintptr_t)seg)) {
            if (sized)
                lull_free_sized_slow(who, p, size);
            else
                lull_free_not_segment(p); /* NULL, huge, or not lull's */
            return;
        }
        span = lull_span_at(seg, off);
    }
    if (sized && __builtin_expect(span->size_class != lull_small_class_of[(size + 7) >> 3], 0)) {
        lull_free_sized_slow(who, p, size);
        return;
    }
    lull_heap *h = lull_tl_heap;
    lull_block *b = p;
    if (__builtin_expect(lull_span_owned_by(span, h), 1)) {
#ifndef LULL_NO_DOUBLE_FREE_CHECK
        /* the deferred free: this block waits in the heap, asked for
         * writable, and the one freed before it is checked and linked now,
         * its line here by now */
        lull_prefetch_for_write(b);
        lull_block *before = h->deferred;
        lull_span *before_span = h->deferred_span;
        h->deferred = b;
        h->deferred_span = span;
        /* free(p); free(p), the commonest double free, seen at once. None
         * before (the slot's mark, h->deferred_none) needs no test here:
         * the mark looks free, and lull_free_local_checked knows it. */
        if (__builtin_expect(before == b, 0)) {
            lull_free_deferred_repeat(b);
            return;
        }
        /* a pointer inside a block would be handed out again overlapping
         * the live one: abort (a multiply and a compare; no load of p).
         * Tested once p is in the slot, where the abort reads it back: the
         * multiply then works in p's own register (1 instruction fewer,
         * callgrind), and nothing but this free has seen the slot. */
        if (__builtin_expect(lull_block_misaligned(span, p), 0)) lull_fatal_misaligned_deferred(h);
        b = before;
        span = before_span;
#else
        if (__builtin_expect(lull_block_misaligned(span, p), 0)) lull_fatal_misaligned(p, span);
#endif
        lull_free_owned_now(b, span, h);
        return;
    }
    lull_free_other(p, span, h);
}

/* always inline, as lull_malloc_inline: at -O2 (RelWithDebInfo, the
 * default build) gcc kept one copy a file, and free() jumped to it: 1
 * instruction a free (callgrind) */
__attribute__((always_inline)) static inline void lull_free_inline(void *p) {
    lull_free_any(p, false, NULL, 0);
}

/* A sized free with alignment 1 (see lull_free_any). */
__attribute__((always_inline)) static inline void lull_free_sized_inline(const char *who, void *p,
                                                                         size_t size) {
    if (__builtin_expect(size <= 1024, 1))
        lull_free_any(p, true, who, size);
    else
        lull_free_sized_slow(who, p, size);
}

#endif
