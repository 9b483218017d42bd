/* The slice state machine; see slice_state.h. Every change of a segment's
 * slice maps is here. */
#include "numa/slice_state.h"
#include "base/bitmap.h"
#include "base/race.h"
#include "base/resident.h"
#include "base/fork_exec.h"

static _Atomic uint64_t *map_of(lull_segment *s, lull_slice_state st) {
    lull_slice_maps *m = lull_slice_maps_of(s);
    switch (st) {
    case LULL_SLICES_DIRTY:
        return m->dirty;
    case LULL_SLICES_WARM:
        return m->warm;
    default:
        return m->clean;
    }
}

void lull_slices_word(const lull_segment *s, unsigned w, lull_slice_word *out) {
    lull_slice_maps *m = lull_slice_maps_of(s);
    out->dirty = atomic_load_explicit(&m->dirty[w], memory_order_relaxed);
    out->purging = atomic_load_explicit(&m->purging[w], memory_order_relaxed);
    out->clean = atomic_load_explicit(&m->clean[w], memory_order_relaxed);
    out->lazy = atomic_load_explicit(&m->lazy[w], memory_order_relaxed);
    out->warm = atomic_load_explicit(&m->warm[w], memory_order_relaxed);
}

uint64_t lull_slices_free_word(const lull_segment *s, unsigned w) {
    lull_slice_word x;
    lull_slices_word(s, w, &x);
    return lull_slice_word_free(&x);
}

void lull_slices_init_segment(lull_segment *s) {
    lull_slice_maps *m = lull_slice_maps_of(s);
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++)
        atomic_store_explicit(&m->clean[w], ~(uint64_t)0, memory_order_relaxed);
    atomic_fetch_and(&m->clean[0], ~(uint64_t)((1u << LULL_META_SLICES) - 1));
}

/* clean slices taken to IN_USE so far (lull_slices_fresh_taken) */
static _Atomic uint64_t fresh_taken;

uint64_t lull_slices_fresh_taken(void) {
    return atomic_load_explicit(&fresh_taken, memory_order_relaxed);
}

lull_take_result lull_slices_take(lull_segment *s, unsigned first, unsigned n, bool *zeroed,
                                  uint64_t lazy[LULL_SLICE_WORDS]) {
    uint64_t got_dirty[LULL_SLICE_WORDS] = {0}, got_clean[LULL_SLICE_WORDS] = {0},
             got_warm[LULL_SLICE_WORDS] = {0};
    lull_slice_maps *m = lull_slice_maps_of(s);
    bool ok = true;
    uint64_t fresh = 0; /* clean slices taken: counted in no state until now */
    for (unsigned i = first; i < first + n;) {
        unsigned w = i / 64, off = i % 64;
        unsigned cnt = 64 - off < first + n - i ? 64 - off : first + n - i;
        uint64_t rest = lull_bits_mask(off, cnt);
        got_dirty[w] = atomic_fetch_and(&m->dirty[w], ~rest) & rest;
        rest &= ~got_dirty[w];
        if (rest) {
            got_warm[w] = atomic_fetch_and(&m->warm[w], ~rest) & rest;
            rest &= ~got_warm[w];
        }
        if (rest) {
            got_clean[w] = atomic_fetch_and(&m->clean[w], ~rest) & rest;
            fresh += (uint64_t)__builtin_popcountll(got_clean[w]);
            rest &= ~got_clean[w];
        }
        if (rest) {
            ok = false;
            break;
        }
        i += cnt;
    }
    lull_take_result r = ok ? LULL_TAKE_OK : LULL_TAKE_RACED;
    /* dirty and warm slices are counted already; clean ones (purged, lazy
     * or never used) come into the estimate now, or not at all */
    if (ok && fresh) {
        if (!lull_resident_try_grow(fresh << LULL_SLICE_SHIFT))
            r = LULL_TAKE_OVER_LIMIT;
        else
            atomic_fetch_add_explicit(&fresh_taken, fresh, memory_order_relaxed);
    }
    if (r != LULL_TAKE_OK) {
        for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
            if (got_dirty[w]) atomic_fetch_or(&m->dirty[w], got_dirty[w]);
            if (got_warm[w]) atomic_fetch_or(&m->warm[w], got_warm[w]);
            if (got_clean[w]) atomic_fetch_or(&m->clean[w], got_clean[w]);
        }
        return r;
    }
    bool zero = true;
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        lazy[w] = 0;
        if (got_dirty[w]) zero = false;
        if (got_clean[w]) {
            lazy[w] = atomic_fetch_and(&m->lazy[w], ~got_clean[w]) & got_clean[w];
            if (lazy[w]) zero = false;
        }
    }
    *zeroed = zero;
    return LULL_TAKE_OK;
}

void lull_slices_give_back(lull_segment *s, unsigned first, unsigned n) {
    for (unsigned i = first; i < first + n;) {
        unsigned off = i % 64;
        unsigned cnt = 64 - off < first + n - i ? 64 - off : first + n - i;
        atomic_fetch_or_explicit(&lull_slice_maps_of(s)->dirty[i / 64], lull_bits_mask(off, cnt),
                                 memory_order_release);
        i += cnt;
    }
}

static size_t emit_runs(lull_segment *s, unsigned w, uint64_t bits, bool resident,
                        lull_slice_run *out, size_t max) {
    size_t n = 0;
    while (bits && n < max) {
        unsigned b = (unsigned)__builtin_ctzll(bits);
        uint64_t rest = ~(bits >> b);
        unsigned len = rest ? (unsigned)__builtin_ctzll(rest) : 64 - b;
        /* cut at 2 MiB extents, so a whole extent is one madvise */
        unsigned slice = w * 64 + b;
        unsigned to_extent = LULL_EXTENT_SLICES - slice % LULL_EXTENT_SLICES;
        if (len > to_extent) len = to_extent;
        out[n++] = (lull_slice_run){s, (uint16_t)slice, (uint16_t)len, resident};
        bits &= ~lull_bits_mask(b, len);
    }
    return n;
}

size_t lull_slices_claim(lull_segment *s, unsigned w, lull_slice_state from_state, uint64_t want,
                         lull_slice_run *out, size_t max, uint64_t *emitted) {
    lull_slice_maps *m = lull_slice_maps_of(s);
    _Atomic uint64_t *from = map_of(s, from_state);
    *emitted = 0;
    uint64_t got = atomic_fetch_and_explicit(&from[w], ~want, memory_order_acq_rel) & want;
    if (!got) return 0;
    LULL_RACE_POINT(LULL_RACE_RECLAIM_CLAIM); /* taken from `from`, not yet PURGING */
    atomic_fetch_or_explicit(&m->purging[w], got, memory_order_relaxed);
    size_t n = emit_runs(s, w, got, from_state != LULL_SLICES_CLEAN, out, max);
    for (size_t i = 0; i < n; i++)
        *emitted |= lull_bits_mask(out[i].first % 64, out[i].count);
    uint64_t left = got & ~*emitted;
    if (left) {
        atomic_fetch_or(&from[w], left);
        atomic_fetch_and(&m->purging[w], ~left);
    }
    return n;
}

void lull_slices_finish(const lull_slice_run *r, lull_slice_state to) {
    lull_segment *s = r->segment;
    lull_slice_maps *m = lull_slice_maps_of(s);
    unsigned w = r->first / 64;
    uint64_t mask = lull_bits_mask(r->first % 64, r->count);
    /* the estimate grows before the maps show a counted state and shrinks
     * after they stop: it may run above them for an instant, never below */
    bool resident = to == LULL_SLICES_DIRTY || to == LULL_SLICES_WARM;
    uint64_t bytes = (uint64_t)r->count << LULL_SLICE_SHIFT;
    if (resident && !r->resident) lull_resident_add(bytes);
    if (to == LULL_SLICES_CLEAN_LAZY)
        atomic_fetch_or_explicit(&m->lazy[w], mask, memory_order_relaxed);
    atomic_fetch_or_explicit(&map_of(s, to)[w], mask, memory_order_release);
    LULL_RACE_POINT(LULL_RACE_RECLAIM_FINISH); /* in `to` and still PURGING */
    atomic_fetch_and_explicit(&m->purging[w], ~mask, memory_order_release);
    if (!resident && r->resident) lull_resident_sub(bytes);
}

void lull_slices_clear_lazy(lull_segment *s, unsigned w, uint64_t bits) {
    atomic_fetch_and(&lull_slice_maps_of(s)->lazy[w], ~bits);
}

/* The estimate stays: a direct claim is of dirty slices (counted in
 * PURGING as in dirty). */
LULL_FORK_EXEC_TEXT void lull_slices_after_fork(lull_segment *s) {
    lull_slice_maps *m = lull_slice_maps_of(s);
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        /* read first: a write to a word that is 0 already would copy the
         * segment's first page for nothing (a fork child that execs at
         * once took that fault for every segment) */
        uint64_t p = atomic_load(&m->purging[w]);
        if (!p) continue;
        atomic_store(&m->purging[w], 0);
        atomic_fetch_or(&m->dirty[w], p);
    }
}
