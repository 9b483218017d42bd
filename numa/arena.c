/* Node arenas and slice-state transitions; see arena.h for the invariant. */
#include "numa/arena.h"
#include "base/race.h"
#include "numa/region_filler.h"
#include "numa/thp.h"
#include "numa/slice_history.h"
#include "numa/slice_state.h"
#include "numa/span_table.h"
#include "base/bitmap.h"
#include "base/os.h"
#include "base/resident.h"
#include "base/segment_map.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <string.h>
#include <time.h>

/* with their locks, which a fork child resets (base/fork_exec.h) */
LULL_FORK_EXEC_DATA lull_arena lull_arenas[LULL_MAX_NODES];
int lull_arena_count = 1;
void (*lull_segment_prepare_hook)(void *segment, size_t len, int node);

static struct timespec start_time;

/* Read and installed atomically: a thread may take a span while the
 * library constructor installs them. */
static struct {
    void (*reused)(uint32_t, uint32_t, bool, uint32_t);
    void (*purged)(uint32_t);
    void (*span_given_back)(void);
    void (*span_taking)(void);
} listener LULL_FORK_EXEC_DATA;

LULL_FORK_EXEC_TEXT void lull_arena_listen(const lull_arena_listener *l) {
    __atomic_store_n(&listener.reused, l->reused, __ATOMIC_RELEASE);
    __atomic_store_n(&listener.purged, l->purged, __ATOMIC_RELEASE);
    __atomic_store_n(&listener.span_given_back, l->span_given_back, __ATOMIC_RELEASE);
    __atomic_store_n(&listener.span_taking, l->span_taking, __ATOMIC_RELEASE);
}

#define NOTIFY(event, ...)                                                                         \
    do {                                                                                           \
        __typeof__(listener.event) fn_ = __atomic_load_n(&listener.event, __ATOMIC_ACQUIRE);       \
        if (fn_) fn_(__VA_ARGS__);                                                                 \
    } while (0)

uint32_t lull_now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint32_t)((t.tv_sec - start_time.tv_sec) * 1000 +
                      (t.tv_nsec - start_time.tv_nsec) / 1000000);
}

void lull_arenas_init(int nodes) {
    if (nodes < 1) nodes = 1;
    if (nodes > LULL_MAX_NODES) nodes = LULL_MAX_NODES;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &start_time);
    start_time.tv_sec -= 1; /* so that "now" is never 0 */
    for (int i = 0; i < LULL_MAX_NODES; i++) {
        pthread_mutex_init(&lull_arenas[i].lock, NULL);
        lull_arenas[i].node = i;
    }
    lull_arena_count = nodes;
}

/* A new segment, or NULL: no address space, or (*over) no room under the
 * heap limit for its header. The header is resident from the mapping on,
 * so it joins the estimate in one step that refuses to pass the limit
 * (base/resident.h): the callers' check of the room, then a count without
 * one, let another thread's growth in between (a huge block, the warm
 * reserve, another node's arena, none of which takes this arena's lock)
 * pass the limit by the header (tests/test_limit_segment_header.c). */
static lull_segment *segment_create(lull_arena *a, bool *over) {
    uint64_t header = (uint64_t)LULL_META_SLICES << LULL_SLICE_SHIFT;
    *over = !lull_resident_try_grow(header);
    if (*over) return NULL;
    lull_segment *s = lull_os_segment_map();
    if (!s) {
        lull_resident_sub(header);
        return NULL;
    }
    if (lull_segment_prepare_hook) lull_segment_prepare_hook(s, LULL_SEGMENT_SIZE, a->node);
    /* fresh anonymous memory is zero: only non-zero fields are written */
    s->magic = LULL_SEGMENT_MAGIC;
    s->arena = a;
    s->node = a->node;
    s->index = atomic_load(&a->segment_count);
    lull_slices_init_segment(s);
    lull_span_table_init_segment(s);
    s->next = atomic_load(&a->segments);
    lull_segment_publish((uintptr_t)s); /* the map and the run, before any block of it exists */
    atomic_store_explicit(&a->segments, s, memory_order_release);
    atomic_fetch_add(&a->segment_count, 1);
    return s;
}

/* Feed the purge policy: how long each slice taken now had been free, and
 * whether it had been purged meanwhile (a wasted purge). Slices that were
 * freed at the same moment are recorded together. */
static void record_reuse(lull_segment *s, unsigned first, unsigned n, const uint64_t *lazy) {
    lull_slice_history *history = lull_slice_history_of(s);
    uint32_t now = lull_now_ms();
    for (unsigned i = first; i < first + n;) {
        uint32_t freed = atomic_load_explicit(&history->freed_ms[i], memory_order_relaxed);
        uint32_t purged = atomic_load_explicit(&history->purged_ms[i], memory_order_relaxed);
        unsigned j = i + 1;
        while (j < first + n &&
               atomic_load_explicit(&history->freed_ms[j], memory_order_relaxed) == freed &&
               (atomic_load_explicit(&history->purged_ms[j], memory_order_relaxed) != 0) ==
                   (purged != 0))
            j++;
        /* the refault monitor looks at which of its pages come back; not for
         * MADV_FREE'd slices, whose pages may simply still be there (a
         * reuse that cost no fault) */
        if (purged)
            for (unsigned k = i; k < j;) {
                unsigned off = k % 64, cnt = 64 - off < j - k ? 64 - off : j - k;
                uint64_t bits = lull_bits_mask(off, cnt) & ~lazy[k / 64];
                if (bits)
                    atomic_fetch_or_explicit(&history->refault_watch[k / 64], bits,
                                             memory_order_relaxed);
                k += cnt;
            }
        if (freed) /* 0: never used since the segment was mapped */
            NOTIFY(reused, now - freed, j - i, purged != 0, purged ? now - purged : 0);
        i = j;
    }
}

/* Try to claim slices [first, first+n) of s from the free maps. All or
 * nothing: bits taken before a failure are put back where they came from. */
static lull_take_result claim_run(lull_segment *s, unsigned first, unsigned n, bool *zeroed) {
    uint64_t was_lazy[LULL_SLICE_WORDS];
    lull_take_result r = lull_slices_take(s, first, n, zeroed, was_lazy);
    if (r == LULL_TAKE_OK) record_reuse(s, first, n, was_lazy);
    return r;
}

/* take_span's search after a run ran over the heap limit: only slices the
 * resident estimate counts already (dirty, warm), which take no room */
#define RESIDENT_PASS 4

/* The slices of one word that search pass `pass` may take (take_span). */
static uint64_t pass_avail(const lull_slice_word *x, int pass) {
    uint64_t d = x->dirty, wm = x->warm, c = x->clean, lz = x->clean & x->lazy;
    if (pass == RESIDENT_PASS) return d | wm;
    return pass == 0 ? d : pass == 1 ? (d | lz) : pass == 2 ? (d | lz | wm) : (d | wm | c);
}

static int find_in_segment(lull_segment *s, unsigned n, int pass) {
    uint64_t avail[LULL_SLICE_WORDS];
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        lull_slice_word x;
        lull_slices_word(s, w, &x);
        avail[w] = pass_avail(&x, pass);
    }
    return lull_bitmap_find_run(avail, LULL_META_SLICES, n);
}

#define PASSES 4

/* thp on (numa/region_filler.h): one walk over the arena finds, for each
 * search pass, the run of n slices inside one 2 MiB region in the fullest
 * region that has one (best[pass]), and counts the slices the pass may
 * take at all (avail[pass]: none, and the pass is skipped). One walk for
 * all passes: a walk for each pass took 180 M instructions in the spans of
 * a 512 MiB heap (callgrind, bench_thp --mode tlb), first fit 86 M, this
 * one 32 M (the passes that have nothing are skipped). */
static void scan_regions(lull_arena *a, unsigned n, lull_region_choice best[PASSES],
                         size_t avail[PASSES]) {
    for (int pass = 0; pass < PASSES; pass++) {
        best[pass] = (lull_region_choice){0};
        avail[pass] = 0;
    }
    for (lull_segment *s = atomic_load(&a->segments); s; s = s->next)
        for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            uint64_t free_slices = lull_slice_word_free(&x);
            if (!free_slices) continue;
            for (int pass = 0; pass < PASSES; pass++) {
                uint64_t bits = pass_avail(&x, pass);
                if (!bits) continue;
                avail[pass] += (size_t)__builtin_popcountll(bits);
                lull_region_consider(&best[pass], s, w, bits, free_slices, n);
            }
            /* no region is fuller than one the span fills, and no pass
             * comes before the first */
            if (best[0].segment && best[0].region_free == n) return;
        }
}

static void span_init_slices(lull_segment *s, unsigned first, unsigned n) {
    for (unsigned i = 0; i < n; i++) {
        lull_span_head_set(s, first + i, (uint16_t)(first * sizeof(lull_span)));
        if (i) lull_span_table_of(s)->slices[first + i].kind = LULL_SPAN_NONE;
    }
    lull_span *head = &lull_span_table_of(s)->slices[first];
    head->slice_count = (uint16_t)n;
}

/* Any run of n slices that pass `pass` may take, first fit from the newest
 * segment, with the arena's mutex held; on success the mutex is released.
 * NULL: none (*over: one was found, and it needs room the heap limit does
 * not leave; the mutex is still held). */
static lull_span *first_fit(lull_arena *a, unsigned n, int pass, bool *zeroed, bool *over) {
    for (lull_segment *s = atomic_load(&a->segments); s; s = s->next) {
        for (int tries = 0; tries < 4; tries++) {
            int idx = find_in_segment(s, n, pass);
            if (idx < 0) break;
            lull_take_result r = claim_run(s, (unsigned)idx, n, zeroed);
            if (r == LULL_TAKE_OK) {
                pthread_mutex_unlock(&a->lock);
                span_init_slices(s, (unsigned)idx, n);
                return &lull_span_table_of(s)->slices[idx];
            }
            if (r == LULL_TAKE_OVER_LIMIT) {
                *over = true;
                return NULL;
            }
            /* the reclaim thread claimed part of it meanwhile: look again */
        }
    }
    return NULL;
}

/* One search, under the arena's mutex; *over: the span needs memory that
 * is not resident, and the heap limit leaves no room for it. */
static lull_span *take_span(lull_arena *a, unsigned n, bool *zeroed, bool *over) {
again:
    *over = false;
    pthread_mutex_lock(&a->lock);
    /* dirty memory is resident already: reuse it first; then slices given
     * back with MADV_FREE (resident until the kernel needs the memory:
     * taking them faults nothing, and leaving them for fresh slices made the
     * burst bench's RSS climb to 2.5x its working set); then the warm
     * reserve (taken before lazy slices, it is refilled from fresh memory
     * while the lazy ones pile up); then clean (purged or fresh) slices */
    bool fill_regions = n < LULL_THP_REGION_SLICES && lull_thp_on();
    lull_region_choice best[PASSES];
    size_t avail[PASSES];
    if (fill_regions) scan_regions(a, n, best, avail);
    int races = 0;
    for (int pass = 0; pass < PASSES; pass++) {
        if (fill_regions) {
            if (avail[pass] < n) continue; /* no run for this pass anywhere */
            if (best[pass].segment) {
                lull_segment *s = best[pass].segment;
                unsigned at = (unsigned)best[pass].first;
                lull_take_result r = claim_run(s, at, n, zeroed);
                if (r == LULL_TAKE_OK) {
                    pthread_mutex_unlock(&a->lock);
                    span_init_slices(s, at, n);
                    return &lull_span_table_of(s)->slices[at];
                }
                if (r == LULL_TAKE_OVER_LIMIT) goto over_limit;
                /* the reclaim thread claimed part of it meanwhile: look
                 * again, a few times, then take any run */
                if (races++ < 4) {
                    scan_regions(a, n, best, avail);
                    pass = -1; /* from the first pass again */
                    continue;
                }
            }
        }
        /* no region has a run for it (or thp is off): any run, first fit
         * from the newest segment. Not next fit from where the last search
         * succeeded: that walked a churn through every dirty slice of the
         * arena, each taken again before it was old enough to purge
         * (tests/soak at a 2 s delay held 490 MiB dirty at 64 MiB live;
         * first fit 50). First fit leaves what a churn does not need alone
         * to age (test_arena's a_steady_churn_takes_the_same_slices_again). */
        lull_span *span = first_fit(a, n, pass, zeroed, over);
        if (span) return span;
        if (*over) goto over_limit;
    }
    /* a new segment: its header and the span must fit under the limit */
    if (lull_resident_room() < ((uint64_t)LULL_META_SLICES + n) << LULL_SLICE_SHIFT)
        goto over_limit;
    bool no_room;
    lull_segment *s = segment_create(a, &no_room);
    if (!s) {
        if (no_room) goto over_limit; /* the room was taken since the check */
        pthread_mutex_unlock(&a->lock);
        errno = ENOMEM;
        return NULL;
    }
    LULL_RACE_POINT(LULL_RACE_SEGMENT_NEW);
    lull_take_result r = claim_run(s, LULL_META_SLICES, n, zeroed);
    pthread_mutex_unlock(&a->lock);
    if (r == LULL_TAKE_OK) {
        span_init_slices(s, LULL_META_SLICES, n);
        return &lull_span_table_of(s)->slices[LULL_META_SLICES];
    }
    /* another thread's growth took the room meanwhile: the segment stays
     * (clean, and its header counted) for later spans */
    *over = r == LULL_TAKE_OVER_LIMIT;
    if (*over) return NULL;
    /* The segment is published (segment_create): the reclaim thread's
     * warm reserve, which claims clean slices without the arena lock, took
     * part of the run meanwhile. Look again (the search starts at the new
     * segment, which has more): returning NULL made a malloc(962) fail
     * with no limit set (tsan_reclaim in CI; test_race_segment) */
    goto again;
over_limit:
    /* A run that needs room is over the limit, but runs of resident slices
     * need none: the passes before took dirty ones only, and lazy slices
     * (clean to the estimate) come before warm ones, so a lazy run over the
     * limit refused the span with warm slices free for it
     * (tests/test_limit_warm_room.c). One more search, of those only
     * (first fit: at the limit, no region to fill is chosen). */
    *over = false;
    lull_span *span = first_fit(a, n, RESIDENT_PASS, zeroed, over);
    if (span) return span;
    pthread_mutex_unlock(&a->lock);
    *over = true;
    return NULL;
}

lull_span *lull_arena_alloc_span(lull_arena *a, unsigned n, bool *zeroed) {
    NOTIFY(span_taking); /* a deferred reclaim thread may start here (reclaim.h) */
    for (bool relieved = false;; relieved = true) {
        bool over;
        lull_span *s = take_span(a, n, zeroed, &over);
        if (s || !over) return s;
        /* over the heap limit: the reclaim thread purges what it can (this
         * thread waits for it, bounded, with no lock held), and one more
         * search takes what it gave back (base/resident.h) */
        if (relieved || !lull_resident_relieve()) {
            lull_resident_refuse();
            return NULL;
        }
    }
}

lull_span *lull_arena_try_alloc_span(lull_arena *a, unsigned n, bool *zeroed) {
    NOTIFY(span_taking);
    bool over;
    int saved = errno;
    lull_span *s = take_span(a, n, zeroed, &over);
    if (!s) errno = saved;
    return s;
}

void lull_arena_free_span(lull_span *span) {
    lull_segment *s = (lull_segment *)((uintptr_t)span & ~LULL_SEGMENT_MASK);
    unsigned first = (unsigned)(span - lull_span_table_of(s)->slices);
    unsigned n = span->slice_count;
    lull_slice_history *history = lull_slice_history_of(s);
    span->kind = LULL_SPAN_NONE;
    atomic_store_explicit(&span->heap, NULL, memory_order_relaxed);
    uint32_t now = lull_now_ms();
    for (unsigned i = first; i < first + n; i++) {
        lull_span_head_set(s, i, 0); /* a stale pointer into it now finds no span */
        atomic_store_explicit(&history->freed_ms[i], now, memory_order_relaxed);
        atomic_store_explicit(&history->purged_ms[i], 0, memory_order_relaxed);
    }
    lull_slices_give_back(s, first, n);
    NOTIFY(span_given_back);
}

/* Reclaim side ------------------------------------------------------- */

/* One claim of a walk over the arena's free slices (lull_claim_cursor):
 * the dirty ones freed at or before before_ms, or (lazy) the MADV_FREE'd
 * ones purged at or before it, to purge again. any_age: every one, whatever
 * its time (lull_purge_all: with the purge delay "never", a slice may have
 * been free longer than the 24 days that a 32-bit millisecond difference
 * tells apart). */
static size_t claim_free(lull_arena *a, bool lazy, uint32_t before_ms, bool any_age,
                         lull_claim_cursor *at, lull_slice_run *out, size_t max, size_t max_bytes) {
    size_t n = 0, bytes = 0;
    bool resume = at && at->segment;
    lull_segment *s =
        resume ? at->segment : atomic_load_explicit(&a->segments, memory_order_acquire);
    unsigned w = resume ? at->word : 0;
    lull_segment *last = s, *first_s = s;
    unsigned first_w = w;
    for (; s && n < max && bytes < max_bytes; w = 0) {
        lull_slice_history *h = lull_slice_history_of(s);
        /* a lazy slice is claimed by the time of its purge, which made it lazy */
        _Atomic uint32_t *stamp = lazy ? h->purged_ms : h->freed_ms;
        for (; w < LULL_SLICE_WORDS && n < max && bytes < max_bytes; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            uint64_t d = lazy ? x.lazy & x.clean : x.dirty;
            if (!d) continue;
            uint64_t old_enough = any_age ? d : 0;
            for (uint64_t bits = any_age ? 0 : d; bits; bits &= bits - 1) {
                unsigned b = (unsigned)__builtin_ctzll(bits);
                uint32_t t = atomic_load_explicit(&stamp[w * 64 + b], memory_order_relaxed);
                if ((!lazy || t) && (int32_t)(before_ms - t) >= 0) old_enough |= (uint64_t)1 << b;
            }
            if (!old_enough) continue;
            uint64_t free_bits = 0;
            if (lull_thp_on()) {
                /* huge pages with live slices are not split (numa/thp.h) */
                free_bits = lull_slices_free_word(s, w);
                if (!any_age) old_enough = lull_thp_purgeable(s, w, old_enough, free_bits);
                if (!old_enough) continue;
            }
            uint64_t emitted;
            n += lull_slices_claim(s, w, lazy ? LULL_SLICES_CLEAN : LULL_SLICES_DIRTY, old_enough,
                                   out + n, max - n, &emitted);
            if (emitted && free_bits) lull_thp_note_purge(s, w, emitted, free_bits);
            /* what is purged again is lazy no more */
            if (lazy && emitted) lull_slices_clear_lazy(s, w, emitted);
            bytes += (size_t)__builtin_popcountll(emitted) * LULL_SLICE_SIZE;
            /* the run bound may have cut this word: the next claim starts
             * at it again (not when the claim started at it: the next one
             * would cut it the same way, and the walk would not move) */
            if (n == max && (s != first_s || w != first_w)) goto stop;
        }
        if (w < LULL_SLICE_WORDS) break; /* a bound: the next claim goes on here */
        last = s;
        s = s->next;
    }
stop:
    if (at) {
        /* at the end of the list: past the last segment */
        at->segment = s ? s : last;
        at->word = s ? w : LULL_SLICE_WORDS;
    }
    return n;
}

size_t lull_arena_claim_dirty(lull_arena *a, uint32_t freed_before_ms, lull_claim_cursor *at,
                              lull_slice_run *out, size_t max, size_t max_bytes) {
    return claim_free(a, false, freed_before_ms, false, at, out, max, max_bytes);
}

size_t lull_arena_claim_all_dirty(lull_arena *a, lull_claim_cursor *at, lull_slice_run *out,
                                  size_t max, size_t max_bytes) {
    return claim_free(a, false, 0, true, at, out, max, max_bytes);
}

void lull_arena_purge_done(const lull_slice_run *r, bool lazy) {
    uint32_t now = lull_now_ms();
    for (unsigned i = r->first; i < (unsigned)r->first + r->count; i++)
        atomic_store_explicit(&lull_slice_history_of(r->segment)->purged_ms[i], now,
                              memory_order_relaxed);
    NOTIFY(purged, r->count);
    lull_slices_finish(r, lazy ? LULL_SLICES_CLEAN_LAZY : LULL_SLICES_CLEAN);
}

size_t lull_arena_claim_lazy(lull_arena *a, uint32_t purged_before_ms, lull_claim_cursor *at,
                             lull_slice_run *out, size_t max, size_t max_bytes) {
    return claim_free(a, true, purged_before_ms, false, at, out, max, max_bytes);
}

size_t lull_arena_claim_all_lazy(lull_arena *a, lull_claim_cursor *at, lull_slice_run *out,
                                 size_t max, size_t max_bytes) {
    return claim_free(a, true, 0, true, at, out, max, max_bytes);
}

/* Run r dirty, freed now as far as the purge delay is concerned. */
static void dirty_from_now(const lull_slice_run *r) {
    uint32_t now = lull_now_ms();
    for (unsigned i = r->first; i < (unsigned)r->first + r->count; i++)
        atomic_store_explicit(&lull_slice_history_of(r->segment)->freed_ms[i], now,
                              memory_order_relaxed);
    lull_slices_finish(r, LULL_SLICES_DIRTY);
}

/* A purge the kernel refused (mlockall: EINVAL) is tried again a delay
 * later, not at every tick. */
void lull_arena_purge_failed(const lull_slice_run *r) {
    dirty_from_now(r);
}

/* The reclaim thread's steps hold its step lock across fork, so a slice is
 * PURGING here only if a claim outside them (a test's direct call) left it
 * so; it is in no other map, and dirty is where it came from. */
LULL_FORK_EXEC_TEXT void lull_arenas_after_fork_child(void) {
    for (int i = 0; i < LULL_MAX_NODES; i++) {
        lull_mutex_reset_in_child(&lull_arenas[i].lock);
        for (lull_segment *s = atomic_load(&lull_arenas[i].segments); s; s = s->next)
            lull_slices_after_fork(s);
    }
}

/* Warm reserve ------------------------------------------------------- */

/* Claim up to `max_slices` slices in state `from` (but not lazy ones, when
 * skip_lazy) into PURGING, as runs; the caller finishes each run. */
static size_t take_runs(lull_arena *a, lull_slice_state from, bool skip_lazy, size_t max_slices,
                        lull_slice_run *out, size_t max) {
    size_t n = 0, slices = 0;
    for (lull_segment *s = atomic_load_explicit(&a->segments, memory_order_acquire);
         s && n < max && slices < max_slices; s = s->next) {
        for (unsigned w = 0; w < LULL_SLICE_WORDS && n < max && slices < max_slices; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            uint64_t want = from == LULL_SLICES_WARM ? x.warm : x.clean;
            if (skip_lazy) want &= ~x.lazy;
            while (want && (size_t)__builtin_popcountll(want) > max_slices - slices)
                want &= ~((uint64_t)1 << (63 - __builtin_clzll(want))); /* drop the highest */
            if (!want) continue;
            uint64_t emitted;
            n += lull_slices_claim(s, w, from, want, out + n, max - n, &emitted);
            slices += (size_t)__builtin_popcountll(emitted);
        }
    }
    return n;
}

size_t lull_arena_take_clean(lull_arena *a, size_t max_slices, lull_slice_run *out, size_t max) {
    /* only zeroed clean slices: lazy ones are still resident anyway */
    return take_runs(a, LULL_SLICES_CLEAN, true, max_slices, out, max);
}

size_t lull_arena_take_warm(lull_arena *a, size_t max_slices, lull_slice_run *out, size_t max) {
    return take_runs(a, LULL_SLICES_WARM, false, max_slices, out, max);
}

size_t lull_arena_take_clean_regions(lull_arena *a, size_t max_regions, lull_slice_run *out,
                                     size_t max) {
    size_t n = 0;
    if (max > max_regions) max = max_regions;
    for (lull_segment *s = atomic_load_explicit(&a->segments, memory_order_acquire); s && n < max;
         s = s->next) {
        for (unsigned w = 0; w < LULL_SLICE_WORDS && n < max; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            uint64_t zeroed = x.clean & ~x.lazy;
            for (unsigned h = 0; h < 2 && n < max; h++) {
                uint64_t region = (uint64_t)0xffffffffu << (32 * h);
                if ((zeroed & region) != region) continue;
                uint64_t emitted;
                size_t k =
                    lull_slices_claim(s, w, LULL_SLICES_CLEAN, region, out + n, max - n, &emitted);
                if (k == 1 && emitted == region) {
                    n++;
                    continue;
                }
                /* a request thread took part of it meanwhile: not whole */
                for (size_t i = 0; i < k; i++)
                    lull_slices_finish(&out[n + i], LULL_SLICES_CLEAN);
            }
        }
    }
    return n;
}

void lull_arena_make_warm_prefaulted(const lull_slice_run *r) {
    for (unsigned i = r->first; i < (unsigned)r->first + r->count; i++)
        atomic_store_explicit(&lull_slice_history_of(r->segment)->purged_ms[i], 0,
                              memory_order_relaxed);
    lull_slices_finish(r, LULL_SLICES_WARM);
}

void lull_arena_warm_to_dirty(const lull_slice_run *r) {
    dirty_from_now(r);
}

void lull_arena_make_warm(const lull_slice_run *r) {
    lull_slices_finish(r, LULL_SLICES_WARM);
}

void lull_arena_return_clean(const lull_slice_run *r) {
    lull_slices_finish(r, LULL_SLICES_CLEAN);
}

size_t lull_arena_count_slices(lull_arena *a, int which) {
    size_t n = 0;
    for (lull_segment *s = atomic_load_explicit(&a->segments, memory_order_acquire); s; s = s->next)
        for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
            lull_slice_word x;
            lull_slices_word(s, w, &x);
            uint64_t m = which == 0 ? x.dirty : which == 1 ? x.warm : x.clean;
            n += (size_t)__builtin_popcountll(m);
        }
    return n;
}

void lull_arena_populate_metadata(lull_arena *a) {
    static _Atomic bool unsupported;
    for (lull_segment *s = atomic_load_explicit(&a->segments, memory_order_acquire); s;
         s = s->next) {
        if (atomic_load_explicit(&s->meta_populated, memory_order_relaxed)) break;
        if (!atomic_load_explicit(&unsupported, memory_order_relaxed)) {
            int err = lull_os_populate(s, LULL_PAGES_OF(LULL_META_END));
            if (err == EINVAL || err == ENOSYS)
                atomic_store_explicit(&unsupported, true, memory_order_relaxed);
        }
        atomic_store_explicit(&s->meta_populated, 1, memory_order_relaxed);
    }
}

bool lull_arena_add_spare_segment(lull_arena *a) {
    /* its header is resident: not past the heap limit */
    if (lull_resident_room() < (uint64_t)LULL_META_SLICES << LULL_SLICE_SHIFT) return false;
    pthread_mutex_lock(&a->lock);
    bool no_room;
    lull_segment *s = segment_create(a, &no_room);
    pthread_mutex_unlock(&a->lock);
    return s != NULL;
}
