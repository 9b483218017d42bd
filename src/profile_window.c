/* The heap's side of the sampled profile: the per-class windows and the
 * bytes to each class's next sample point (see profile.h).
 *
 * Invariant: a window's blocks are counted in use in their span (its
 * `used` went up by the cut), are on no free list, and end before the
 * class's next sample point: the window holds at most
 * (until_sample - 1) / block_size blocks, so the allocation after its last
 * one is the one that crosses the point. Only the heap's owner touches its
 * windows. */
#include "src/profile.h"
#include "src/profile_math.h"
#include "src/reuse.h"
#include "src/alloc.h"
#include "numa/arena.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"

#include <sys/mman.h>

#define MIN_WINDOW 64

static uint64_t next_random(lull_heap_profile *p) {
    p->rng ^= p->rng >> 12;
    p->rng ^= p->rng << 25;
    p->rng ^= p->rng >> 27;
    return p->rng * 0x2545f4914f6cdd1dULL;
}

/* Bytes to the next point of a Poisson process of mean interval I: an
 * exponential draw, at least 1. */
static int64_t bytes_to_next_sample(lull_heap_profile *p) {
    double u = ((double)(next_random(p) >> 11) + 1.0) / 9007199254740992.0; /* (0, 1] */
    double x = -lull_ln(u) * (double)lull_profile_interval_now();
    return x < 1.0 ? 1 : x > 4e18 ? (int64_t)4e18 : (int64_t)x;
}

bool lull_profile_heap_attach(lull_heap *h) {
    size_t len = (sizeof(lull_heap_profile) + 4095) & ~(size_t)4095;
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return false;
    lull_heap_profile *p = m;
    p->rng = (((uint64_t)(uintptr_t)h * 0x9e3779b97f4a7c15ULL) ^ (uint64_t)(uintptr_t)p) | 1;
    for (unsigned c = 0; c < LULL_CLASSES; c++)
        p->until_sample[c] = bytes_to_next_sample(p);
    p->large_until_sample = bytes_to_next_sample(p);
    h->profile = p;
    lull_reuse_init(h); /* closed: the windows own direct[] (a new heap's lists are empty) */
    /* from now on the fast path pops from the windows (empty: the first
     * malloc of each size takes the slow path and cuts one) */
    for (unsigned c = 1; c < lull_class_count; c++)
        lull_direct_point(h, c, &p->window[c]);
    return true;
}

#define SPANS_LOOKED_AT 8

/* The span of class c with the longest list, made current, when the
 * current span s has fewer than MIN_WINDOW blocks listed: malloc takes
 * from the current span, so that span fills up while frees thin out the
 * others, and its list holds only what came back since its last window
 * (bench/callgrind.sh mixed: windows of 12 blocks for 1 KiB, whose spans
 * hold 64). The first few of the class's spans are looked at. */
static inline lull_span *longest_list(lull_heap *h, unsigned c, lull_span *s) {
    if (h->queue[c].head == h->queue[c].tail) return s; /* the only one */
    uint32_t longest = s->carved - lull_span_used(s);
    lull_span *best = s;
    unsigned looked = 0;
    for (lull_span *o = h->queue[c].head; o && looked < SPANS_LOOKED_AT; o = o->next, looked++) {
        if (o == s || !o->free || o->parking) continue;
        uint32_t listed = o->carved - lull_span_used(o);
        if (listed > longest) {
            best = o;
            longest = listed;
        }
    }
    if (best != s) {
        lull_heap_queue_remove(&h->queue[c], best);
        lull_heap_queue_push_front(&h->queue[c], best);
        lull_heap_set_current(h, c, best);
    }
    return best;
}

/* A new window for class c, from its current span (refilled if it has no
 * free block, or another if its list is short), ending before the next
 * sample point. False when no memory is left. */
static bool cut_window(lull_heap *h, unsigned c) {
    lull_heap_profile *p = h->profile;
    lull_span *s = h->current[c];
    if (!s->free && !(s = lull_class_refill(h, c))) return false;
    if (s->carved - lull_span_used(s) < MIN_WINDOW) s = longest_list(h, c, s);
    uint32_t bs = s->block_size;
    uint64_t before_point = (uint64_t)(p->until_sample[c] - 1) / bs;
    /* a window ends at the first malloc that finds it empty: one trip
     * down the slow path (about 90 instructions, lull_profile_next_window)
     * per window. Where frees come back about as fast as mallocs go out,
     * the list holds only the blocks freed since the last window, a
     * handful for a class of a mixed workload; so a short list is
     * lengthened by carving, up to MIN_WINDOW blocks (bench/callgrind.sh
     * mixed at profile_sample_kb=8192: 117.8 instructions a pair without
     * it; 106.9 with it, the longest list and the short path, as with
     * profiling off) */
    while (!s->parking && s->carved < s->capacity && s->carved - lull_span_used(s) < MIN_WINDOW &&
           s->carved - lull_span_used(s) < before_point)
        lull_span_extend(s);
    /* a span's local list holds every carved block not in use: blocks
     * freed by other threads are counted in use until they are collected */
    uint32_t listed = s->carved - lull_span_used(s);
    lull_block *first = s->free;
    uint32_t n = listed;
    if (before_point < listed) {
        /* the sample point falls in this list: cut it there (a walk once
         * per sample) */
        n = before_point ? (uint32_t)before_point : 1;
        lull_block *last = first;
        for (uint32_t i = 1; i < n; i++)
            last = lull_block_next(last);
        s->free = lull_block_next(last);
        lull_block_set_next(last, NULL);
    } else {
        s->free = NULL;
    }
    s->used += n; /* as n pops would */
    p->window[c].free = first;
    p->window_cut[c] = n;
    return true;
}

void *lull_profile_alloc_small(lull_heap *h, unsigned c, size_t size, bool *zeroed) {
    lull_heap_free_deferred(h); /* the windows' pops do not compare with it */
    lull_heap_profile *p = h->profile;
    lull_span *w = &p->window[c];
    if (!w->free) {
        /* every block of the last window went out */
        uint32_t bs = lull_classes[c].block_size;
        p->until_sample[c] -= (int64_t)p->window_cut[c] * bs;
        p->window_cut[c] = 0;
        if (p->until_sample[c] <= (int64_t)bs) {
            /* this allocation crosses the point */
            p->until_sample[c] = bytes_to_next_sample(p);
            /* a spare is one slice: classes go up to LULL_SMALL_MAX */
            void *b = p->spares && size <= LULL_SLICE_SIZE
                          ? lull_large_alloc_again(p->spare[--p->spares], size)
                          : lull_large_alloc_sample(h, size);
            if (b) {
                lull_span *s = lull_span_of(lull_segment_of(b), b);
                s->sampled = 1;
                *zeroed = s->zeroed;
                h->allocs++;
                lull_profile_sampled(b, size, bs);
                return b;
            }
            /* no slice for it: served unsampled */
        }
        if (!cut_window(h, c)) return NULL;
    }
    lull_block *b = w->free;
    w->free = lull_block_next(b);
    h->allocs++;
    *zeroed = false;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    b->next_encoded = 0; /* see lull_malloc_inline */
#endif
    return b;
}

void *lull_profile_next_window(lull_heap *h, unsigned c) {
    lull_heap_free_deferred(h); /* the windows' pops do not compare with it */
    lull_heap_profile *p = h->profile;
    lull_span *s = h->current[c];
    lull_block *first = s->free;
    if (!first) return NULL; /* a refill */
    uint32_t bs = s->block_size;
    int64_t left = p->until_sample[c] - (int64_t)p->window_cut[c] * bs;
    uint32_t listed = s->carved - lull_span_used(s);
    if (listed < MIN_WINDOW) {
        s = longest_list(h, c, s);
        first = s->free;
        listed = s->carved - lull_span_used(s);
        if (listed < MIN_WINDOW && !s->parking && s->carved < s->capacity)
            return NULL; /* cut_window carves */
    }
    /* the sample point falls in the list, or is this allocation */
    if ((int64_t)listed * bs >= left) return NULL;
    s->free = NULL;
    s->used += listed; /* as `listed` pops would */
    p->until_sample[c] = left;
    p->window_cut[c] = listed;
    p->window[c].free = lull_block_next(first);
    h->allocs++;
#ifndef LULL_NO_DOUBLE_FREE_CHECK
    first->next_encoded = 0; /* see lull_malloc_inline */
#endif
    return first;
}

bool lull_profile_large_due(lull_heap *h, size_t size) {
    lull_heap_profile *p = h->profile;
    p->large_until_sample -= (int64_t)(size ? size : 1);
    if (p->large_until_sample > 0) return false;
    p->large_until_sample = bytes_to_next_sample(p);
    return true;
}

bool lull_profile_keep_span(lull_heap *h, lull_span *span) {
    lull_heap_profile *p = h->profile;
    if (!p || p->spares == LULL_PROFILE_SPARE_SPANS || span->block_size != LULL_SLICE_SIZE)
        return false;
    p->spare[p->spares++] = span;
    return true;
}

void lull_profile_heap_flush(lull_heap *h) {
    lull_heap_profile *p = h->profile;
    if (!p) return;
    while (p->spares)
        lull_arena_free_span(p->spare[--p->spares]);
    for (unsigned c = 1; c < lull_class_count; c++) {
        lull_span *w = &p->window[c];
        uint32_t back = 0;
        for (lull_block *b = w->free, *next; b; b = next) {
            next = lull_block_next(b);
            /* freed as its owner frees it: onto its span's list, which
             * may empty (and release) the span */
            lull_span *s = lull_span_of(lull_segment_of(b), b);
            lull_block_set_next(b, s->free);
            s->free = b;
            if (lull_span_put_back_one(s)) lull_free_local_tail(h, s);
            back++;
        }
        w->free = NULL;
        p->until_sample[c] -= (int64_t)(p->window_cut[c] - back) * lull_classes[c].block_size;
        if (p->until_sample[c] < 1) p->until_sample[c] = 1;
        p->window_cut[c] = 0;
    }
}

bool lull_profile_window_has(const lull_heap *h, const lull_span *span, const lull_block *b) {
    if (!h->profile) return false;
    uint32_t limit = span->capacity;
    for (const lull_block *f = h->profile->window[span->size_class].free; f && limit--;
         f = lull_block_next(f))
        if (f == b) return true;
    return false;
}
