/* Defragmentation: lull_defrag_query() tells how full a block's span and
 * its size class are and whether moving it would help, lull_defrag_move()
 * moves it out of a sparse span or page into a dense span, so that sparse
 * pages are parked and sparse spans empty and go back (docs/defrag.md).
 *
 * The rule is Redis's (its jemalloc fork's je_get_defrag_hint, and Valkey's
 * makeDefragDecision over experimental.utilization.batch_query): a block
 * moves only if its span is not the current span of its class and is not
 * full, and it is used at most 1.125 times as much as the average of its
 * class's non-full spans. For blocks of 256 B to 2 KiB the same rule is
 * applied to the block's page (below, page_rule): jemalloc's slabs of those
 * bins are one to a few pages, and lull gives back pages of a span that
 * stays in use. A block moves to the densest span of its class that has a
 * free block (the view's first target), never its own span, and never out
 * of that target: the target is never a source.
 *
 * Invariant: only a heap's owner walks its queues and pops from its spans,
 * so a block of another thread's heap is judged from its span alone (racy
 * reads of one descriptor, which segments never unmap) against the caller's
 * own heap, and moves into it; its old block is then a remote free like
 * any other.
 *
 * Walking a class's queue costs a visit per span, so each heap keeps a view
 * per class (base/types.h, lull_defrag_view), taken at a walk and kept while
 * the heap does nothing but defrag moves, which update it: any malloc or
 * free of the heap behind defrag's back (its allocs, frees, spans taken or
 * returned moved) makes every view stale. A server's active defrag runs in
 * steps between requests, so a step pays one walk per class it touches,
 * plus one each time the few densest spans of the walk have filled up. */
#include "lull.h"
#include "src/alloc.h"
#include "src/span_park.h"
#include "src/profile.h"

#include <errno.h>
#include <string.h>

/* a block of a small span that lull handed out: its span, else NULL */
typedef struct {
    lull_span *span; /* small span, or NULL */
    bool large;      /* a large or huge block (valid, never moved) */
    size_t size;     /* its usable size */
} lull_defrag_block;

/* What p is, without aborting: the checks of free() (segment map, span
 * kind, owner, block start), then, for a block of the caller's own heap,
 * whether it is free (on its span's list or on a parked page). Reads of
 * another heap's descriptor race its owner; TSan is told not to watch them
 * (nothing is written, and segment metadata is never unmapped). */
__attribute__((no_sanitize("thread"))) static bool classify(const void *p, lull_defrag_block *out) {
    *out = (lull_defrag_block){0};
    if (!p) return false;
    lull_huge *aligned = lull_aligned_huge_of(p);
    lull_segment *seg = lull_segment_of(p);
    if (!aligned && !lull_segment_map_has((uintptr_t)seg)) return false;
    if (aligned || seg->magic == LULL_HUGE_MAGIC) {
        lull_huge *h = aligned ? aligned : (lull_huge *)seg;
        if ((const char *)p != (char *)h + h->block_offset ||
            atomic_load_explicit(&h->freed, memory_order_acquire))
            return false;
        out->large = true;
        out->size = h->usable;
        return true;
    }
    if (seg->magic != LULL_SEGMENT_MAGIC) return false;
    lull_span *span = lull_span_of(seg, p);
    uint8_t kind = __atomic_load_n(&span->kind, __ATOMIC_ACQUIRE);
    if (kind == LULL_SPAN_LARGE) {
        if ((const uint8_t *)p != lull_span_start(span) + span->block_offset) return false;
        out->large = true;
        out->size = span->block_size - span->block_offset;
        return true;
    }
    if (kind != LULL_SPAN_SMALL) return false;
    lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_acquire);
    if (!owner || !span->block_size || lull_block_misaligned(span, p)) return false;
    size_t off = (size_t)((const uint8_t *)p - lull_span_start(span));
    uint32_t carved = __atomic_load_n(&span->carved, __ATOMIC_RELAXED);
    if (off >= (size_t)carved * span->block_size) return false; /* never handed out */
    if (owner == lull_tl_heap) {
        const lull_block *b = p;
        if (span->parked_pages && lull_span_block_on_parked_page(span, p)) return false;
        if (span->parking && lull_span_parking_has(span, p)) return false; /* freed, recorded */
        /* a free block's first word is a link; a live one's rarely looks
         * like one, and then the lists are walked to be sure: free()'s
         * (its span's local and remote lists, messages, reuse lists: a
         * block another thread freed is as free as one on the local list,
         * and a move of it would die as a double free) and the window */
        if (lull_block_looks_free(b) &&
            (lull_small_block_is_free(span, b) || lull_profile_window_has(owner, span, b)))
            return false;
    }
    if (lull_block_in_message(p)) return false; /* freed by another thread, in flight */
    out->span = span;
    out->size = span->block_size;
    return true;
}

/* The views of h are right only if h did nothing since defrag last looked
 * but what defrag itself did: else a new epoch makes them all stale. */
static void views_check(lull_heap *h) {
    if (h->defrag_epoch && h->defrag_allocs == h->allocs && h->defrag_frees == h->frees &&
        h->defrag_taken == h->spans_taken && h->defrag_returned == h->spans_returned)
        return;
    if (++h->defrag_epoch == 0) h->defrag_epoch = 1;
    h->defrag_allocs = h->allocs;
    h->defrag_frees = h->frees;
    h->defrag_taken = h->spans_taken;
    h->defrag_returned = h->spans_returned;
}

/* Redis's rule: used / capacity <= 1.125 x the class's average over its
 * non-full spans, i.e. used * spans * 8 <= 9 * class_used (every span of
 * a class has the same capacity). */
static bool sparse_enough(uint32_t used, const lull_defrag_view *v) {
    return (uint64_t)used * v->spans * 8 <= 9 * v->used;
}

static uint64_t resident_pages(const lull_span *s) {
    size_t touched = LULL_PAGES_OF((size_t)s->carved * s->block_size) / LULL_PAGE_SIZE;
    return touched > s->parked_pages ? touched - s->parked_pages : 0;
}

/* Can a move land in s: a free block on its list, or in its parking
 * bitmap on a resident page (landing on a parked page would fault it in
 * for the page a move frees: nothing gained). */
static bool takes_blocks(const lull_span *s) {
    return s->free || (s->parking && lull_span_park_has_resident_free(s));
}

/* Walk class c's queue: its spans that are not full (a full span stays
 * in the queue until a refill passes it), the blocks in use in them and
 * their resident pages, and the densest spans with a free block on their
 * list (blocks on parked pages and never carved are not taken: that would
 * fault pages in). */
static lull_defrag_view *view_walk(lull_heap *h, unsigned c) {
    lull_defrag_view *v = &h->defrag[c];
    uint64_t used = 0, pages = 0;
    uint32_t spans = 0, best_used[LULL_DEFRAG_TARGETS] = {0};
    lull_span *best[LULL_DEFRAG_TARGETS] = {0};
    for (lull_span *s = h->queue[c].head; s; s = s->next) {
        uint32_t u = lull_span_used(s);
        if (u >= s->capacity) continue;
        used += u;
        spans++;
        pages += resident_pages(s);
        if (!takes_blocks(s)) continue;
        /* insert into the densest few, densest first (first seen wins a tie) */
        unsigned i = LULL_DEFRAG_TARGETS;
        while (i > 0 && (!best[i - 1] || u > best_used[i - 1]))
            i--;
        if (i == LULL_DEFRAG_TARGETS) continue;
        for (unsigned j = LULL_DEFRAG_TARGETS - 1; j > i; j--) {
            best[j] = best[j - 1];
            best_used[j] = best_used[j - 1];
        }
        best[i] = s;
        best_used[i] = u;
    }
    *v = (lull_defrag_view){.used = used, .pages = pages, .spans = spans, .epoch = h->defrag_epoch};
    memcpy(v->target, best, sizeof best);
    memcpy(v->target_used, best_used, sizeof best_used);
    return v;
}

/* A span kept from the walk can still take blocks: it is still this
 * heap's span of class c, in its queue, with a listed free block, and no
 * move drained it meanwhile (only the first is never a source). Within an
 * epoch only defrag's own moves changed the heap, and those release at most
 * sources (a released span is another heap's or no one's, or in no class:
 * taking it again would have taken an allocation, a new epoch). */
static bool target_ok(const lull_heap *h, unsigned c, const lull_defrag_view *v, unsigned i) {
    const lull_span *s = v->target[i];
    return s && atomic_load_explicit(&s->heap, memory_order_relaxed) == h &&
           s->kind == LULL_SPAN_SMALL && s->size_class == c && !s->in_full && takes_blocks(s) &&
           lull_span_used(s) >= v->target_used[i];
}

/* The view of class c of the calling thread's heap h, walked again if it is
 * stale or all the spans it kept have run out of listed free blocks. */
static lull_defrag_view *view_of(lull_heap *h, unsigned c) {
    views_check(h);
    lull_defrag_view *v = &h->defrag[c];
    if (v->epoch != h->defrag_epoch) return view_walk(h, c);
    if (!v->target[0] || takes_blocks(v->target[0])) return v;
    for (unsigned i = 1; i < LULL_DEFRAG_TARGETS; i++)
        if (target_ok(h, c, v, i)) {
            v->target[0] = v->target[i];
            for (unsigned j = 1; j <= i; j++) /* the ones passed over are done */
                v->target[j] = NULL;
            return v;
        }
    return view_walk(h, c);
}

/* Blocks of 256 B to 2 KiB, 2 to 16 to a page: a span gives back each
 * page that no live block overlaps (parked pages), so what costs memory is
 * a sparse page, not a sparse span, and the rule is applied to the block's
 * page: live blocks on it at most 1.125 x the class's average over its
 * resident pages. A page of 4 blocks after 3 in 4 were freed at random is
 * far more often sparse than a span of 64 (42 % of pages hold one block,
 * while spans hold 16 +- 3.5 of 64): the pages that free up with fewest
 * moves go first. Smaller blocks keep the span rule (a page of them is
 * about as full as its span, and counting it would read too many blocks);
 * larger ones too (a block is a page or more). */
#define PAGE_RULE_MIN 256
#define PAGE_RULE_MAX 2048

static bool page_rule(const lull_span *span) {
    return span->block_size >= PAGE_RULE_MIN && span->block_size <= PAGE_RULE_MAX;
}

/* Live blocks that start on p's page, p included: a block's first word
 * tells whether it is free (a free block's is a link into its own segment:
 * lull_block_looks_free, the test free() makes; a parking span's bitmap
 * says it), without a walk of the list. The owner's own span only: its free blocks are its own, and
 * p's page is NONE (p is live), so no block read here is on a purged page. A live block whose data
 * looks like a link counts as free: only a hint. */
__attribute__((no_sanitize("thread"))) static uint32_t page_live(const lull_span *span,
                                                                 const void *p) {
    const uint8_t *start = lull_span_start(span);
    size_t bs = span->block_size, off = (size_t)((const uint8_t *)p - start);
    size_t page = off / LULL_PAGE_SIZE * LULL_PAGE_SIZE;
    size_t first = (page + bs - 1) / bs, end = (page + LULL_PAGE_SIZE + bs - 1) / bs;
    if (end > span->carved) end = span->carved;
    uint32_t live = 0;
    for (size_t i = first; i < end; i++) {
        const lull_block *b = (const lull_block *)(start + i * bs);
        /* a parking span's free blocks are in its bitmap, their words are
         * the user's last */
        bool free = span->parking ? lull_span_parking_has(span, b) : lull_block_looks_free(b);
        live += b == p || !free;
    }
    return live;
}

/* Racy reads of another heap's span: what its owner last wrote. */
__attribute__((no_sanitize("thread"))) static uint32_t used_racy(const lull_span *s) {
    uint32_t u = (__atomic_load_n(&s->used, __ATOMIC_RELAXED) & ~LULL_SPAN_SLOW_FREE) +
                 __atomic_load_n(&s->park_at, __ATOMIC_RELAXED);
    return u < s->capacity ? u : s->capacity; /* the two reads may disagree */
}

__attribute__((no_sanitize("thread"))) static bool owner_keeps(const lull_span *s,
                                                               const lull_heap *owner) {
    return __atomic_load_n(&owner->current[s->size_class], __ATOMIC_RELAXED) == s ||
           __atomic_load_n(&s->in_full, __ATOMIC_RELAXED);
}

/* The blocks in use in p's span: exact for the caller's own heap, what the
 * owner last wrote for another. */
static uint32_t span_used(const lull_span *span, const lull_heap *h) {
    return atomic_load_explicit(&span->heap, memory_order_relaxed) == h ? lull_span_used(span)
                                                                        : used_racy(span);
}

/* Where the block would go, or NULL when moving it does not help. h is the
 * calling thread's heap (not the empty one); span's owner may be another. */
static lull_span *move_target(lull_heap *h, lull_span *span, const void *p) {
    unsigned c = span->size_class;
    lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_relaxed);
    lull_defrag_view *v = view_of(h, c);
    if (owner == h) {
        if (span == h->current[c] || lull_span_in_full(span)) return NULL;
    } else if (owner_keeps(span, owner)) {
        return NULL; /* judged against the heap it would move to: the owner's
                      * queues are not ours to walk */
    }
    uint32_t used = span_used(span, h);
    lull_span *t = v->target[0];
    if (!t || t == span || used >= span->capacity) return NULL;
    if (owner == h && page_rule(span)) {
        uint32_t live = page_live(span, p);
        if ((uint64_t)live * v->pages * 8 > 9 * v->used) return NULL;
    } else if (!sparse_enough(used, v)) {
        return NULL;
    }
    /* the target is at least as dense: it ends denser than the source */
    if (lull_span_used(t) < used) return NULL;
    return t;
}

static void fill_info(lull_defrag_info *o, const void *p, const lull_defrag_block *b,
                      lull_heap *h) {
    *o = (lull_defrag_info){.block_size = b->size};
    if (b->large) {
        o->span_total = 1;
        o->owned_by_caller = 1; /* nothing to walk: the figures are exact */
        return;
    }
    lull_span *span = b->span;
    bool mine =
        h != &lull_heap_empty && atomic_load_explicit(&span->heap, memory_order_relaxed) == h;
    o->owned_by_caller = mine;
    o->span_total = span->capacity;
    o->moved_would_help = h != &lull_heap_empty && move_target(h, span, p) != NULL;
    o->span_free = span->capacity - span_used(span, h);
    if (mine) { /* view_of() ran in move_target: the view is current */
        const lull_defrag_view *v = &h->defrag[span->size_class];
        o->class_total = (size_t)v->spans * span->capacity;
        o->class_free = o->class_total - v->used;
    }
}

LULL_EXPORT int lull_defrag_query(const void *const *ptrs, size_t n, lull_defrag_info *out) {
    if (n && (!ptrs || !out)) {
        errno = EINVAL;
        return -1;
    }
    lull_heap *h = lull_tl_heap;
    lull_heap_free_deferred(h); /* the spans' used counts are read */
    bool bad = false;
    for (size_t i = 0; i < n; i++) {
        lull_defrag_block b;
        if (!classify(ptrs[i], &b)) {
            out[i] = (lull_defrag_info){0};
            bad = true;
            continue;
        }
        fill_info(&out[i], ptrs[i], &b, h);
    }
    if (bad) {
        errno = EINVAL;
        return -1;
    }
    return 0;
}

/* Pop a block from the target, as malloc does from its current span; a
 * target that fills up leaves the class's non-full figures. */
static void *pop_from(lull_heap *h, lull_span *t, lull_defrag_view *v) {
    lull_block *b = t->free;
    if (b) {
        t->free = lull_block_next(b);
    } else {
        /* a parking target stays parking: the block comes out of its
         * bitmap, on a resident page (its parked pages stay out) */
        if (!t->parking || !(b = lull_span_park_take(t))) return NULL;
    }
    t->used++;
    h->allocs++;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    b->next_encoded = 0; /* see lull_malloc_inline */
#endif
    if (lull_span_used(t) >= t->capacity && v->spans) {
        v->spans--;
        /* the sum counts t at its capacity now (a move leaves it unchanged:
         * one block more in t, one fewer in the source) */
        v->used -= t->capacity < v->used ? t->capacity : v->used;
        uint64_t pg = resident_pages(t);
        v->pages -= pg < v->pages ? pg : v->pages;
    }
    return b;
}

LULL_EXPORT void *lull_defrag_move(void *p) {
    /* a block freed last waits in the heap (the deferred free), on no
     * list: linked first, classify() sees that it is free */
    lull_heap_free_deferred(lull_tl_heap);
    lull_defrag_block b;
    if (!classify(p, &b)) {
        if (p) errno = EINVAL;
        return p;
    }
    lull_heap *h = lull_tl_heap;
    if (!b.span || h == &lull_heap_empty) return p; /* large, or no heap to move into */
    lull_heap_free_deferred(h);                     /* blocks are popped below */
    lull_span *span = b.span;
    unsigned c = span->size_class;
    bool mine = atomic_load_explicit(&span->heap, memory_order_relaxed) == h;
    lull_span *t = move_target(h, span, p);
    if (!t) return p;
    lull_defrag_view *v = &h->defrag[c];
    void *q = pop_from(h, t, v);
    if (!q) return p;
    memcpy(q, p, span->block_size);
    uint64_t returned = h->spans_returned;
    uint64_t pages_before = mine ? resident_pages(span) : 0;
    /* the span a block leaves parks from now on: each page a move
     * empties goes back at once (a span thinned by moves stayed resident
     * until its count reached its park_start: the ratio stopped at 1.21,
     * not 1.10) */
    if (mine && !span->parking && !span->kept && lull_classes[c].park_start)
        lull_span_park_start(span);
    /* local, or a remote free sent to p's owner: kept for this thread's
     * reuse (src/reuse.h), its next malloc would put a block back into the
     * sparse span it just left */
    lull_free_home(p, span, h);
    /* a local free waits as the heap's deferred free: a move frees now,
     * so that the emptied span goes back and the view below is right */
    lull_heap_free_deferred(h);
    bool alive = mine && atomic_load_explicit(&span->heap, memory_order_relaxed) == h;
    /* The view stays right if the heap did only what it expects: one block
     * allocated and one freed (the class's count in use unchanged, or one
     * more for a block that came from another heap), the pages the free or
     * the park above parked out of the resident ones, and at most p's span
     * gone back. Anything else: views_check() starts a new epoch. */
    if (!mine) v->used++;
    uint64_t gone = mine ? pages_before - (alive ? resident_pages(span) : 0) : 0;
    v->pages -= gone < v->pages ? gone : v->pages;
    if (h->spans_returned != returned) {
        if (!mine || alive || h->spans_returned != returned + 1 || !v->spans) return q;
        v->spans--;
    }
    h->defrag_allocs = h->allocs;
    h->defrag_frees = h->frees;
    h->defrag_returned = h->spans_returned;
    return q;
}
