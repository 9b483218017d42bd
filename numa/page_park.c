/* The page state machine of in-use spans; see page_park.h. */
#include "numa/page_park.h"
#include "numa/thp.h"
#include "base/message.h"
#include "base/race.h"
#include "base/resident.h"

#define LOW_BITS 0x55555555u /* the low bit of each page's pair */

void lull_pages_park(lull_segment *s, unsigned slice, uint32_t mask, uint32_t now_ms) {
    lull_parked_pages *parked = lull_parked_pages_of(s);
    /* the slice's time is its oldest PENDING page's: stamped only when it
     * has none. Stamped at every park, a slice whose pages came free one
     * after another, closer together than the purge delay, never had one
     * purged (tests/test_page_park_age.c). A page parked later goes with
     * the older ones, early. A claim between this read and the state's
     * update below can leave the slice with no PENDING page and the old
     * time: the new page is then purged early too, once. */
    uint32_t before = atomic_load_explicit(&parked->page_state[slice], memory_order_relaxed);
    if (!(before & ~(before >> 1) & LOW_BITS))
        atomic_store_explicit(&parked->parked_ms[slice], now_ms, memory_order_relaxed);
    /* release: the reclaim thread that claims a page sees parked_ms, and
     * the owner's last writes to the page happened before its purge */
    uint32_t old = atomic_fetch_or_explicit(&parked->page_state[slice], lull_pages_spread(mask, 1),
                                            memory_order_release);
    if (old & lull_pages_spread(mask, 3))
        lull_fatal("internal error: page parked twice (slice %u of segment %p)", slice, (void *)s);
    /* after the state: a claim that clears the hint re-reads the state */
    atomic_fetch_or_explicit(&parked->parked_slices[slice / 64], (uint64_t)1 << (slice % 64),
                             memory_order_seq_cst);
}

uint32_t lull_pages_take_back(lull_segment *s, unsigned slice, uint32_t mask) {
    uint32_t want = lull_pages_spread(mask, 1);
    _Atomic uint32_t *state = &lull_parked_pages_of(s)->page_state[slice];
    uint32_t old = atomic_load_explicit(state, memory_order_relaxed);
    uint32_t take;
    do {
        take = old & want; /* PENDING (01) and PURGED (11): the low bit */
        if (!take) return 0;
        /* a claim landing here must make the CAS fail */
        LULL_RACE_POINT(LULL_RACE_PAGE_TAKE_BACK);
        /* acquire: a page the reclaim thread purged is zero before the
         * owner writes links into it */
    } while (!atomic_compare_exchange_weak_explicit(state, &old, old & ~(take | take << 1),
                                                    memory_order_acquire, memory_order_relaxed));
    /* the purged ones are resident again once touched: counted now,
     * without a check (the span is this owner's, and so are its pages) */
    uint32_t purged = take & (old >> 1);
    if (purged) lull_resident_add((uint64_t)__builtin_popcount(purged) * LULL_PAGE_SIZE);
    uint32_t taken = 0;
    for (; take; take &= take - 1)
        taken |= 1u << (__builtin_ctz(take) / 2);
    return taken;
}

/* Cut `mask` into runs of contiguous pages, at most `room`; the pages of
 * the runs that fit. */
static uint32_t cut_runs(lull_segment *s, unsigned slice, uint32_t mask, lull_page_run *out,
                         size_t room, size_t *n) {
    uint32_t fitted = 0;
    while (mask && *n < room) {
        unsigned first = (unsigned)__builtin_ctz(mask);
        uint32_t run = mask >> first;
        unsigned len = (unsigned)__builtin_ctz(~run);
        uint32_t bits = (len >= 32 ? ~0u : ((1u << len) - 1)) << first;
        out[(*n)++] =
            (lull_page_run){.segment = s, .slice = (uint16_t)slice, .mask = (uint16_t)bits};
        fitted |= bits;
        mask &= ~bits;
    }
    return fitted;
}

/* Claim the PENDING pages of one slice that fit in `room` runs; *cut: some
 * did not fit. */
static size_t claim_slice(lull_segment *s, unsigned slice, lull_page_run *out, size_t room,
                          bool *cut) {
    _Atomic uint32_t *state = &lull_parked_pages_of(s)->page_state[slice];
    uint32_t old = atomic_load_explicit(state, memory_order_acquire);
    size_t n;
    for (;;) {
        /* PENDING is 01: the low bit without the high one */
        uint32_t pending_low = old & ~(old >> 1) & LOW_BITS;
        if (!pending_low) return 0;
        uint32_t pages = 0;
        for (uint32_t b = pending_low; b; b &= b - 1)
            pages |= 1u << (__builtin_ctz(b) / 2);
        n = 0;
        uint32_t fitted = cut_runs(s, slice, pages, out, room, &n);
        uint32_t flip = lull_pages_spread(fitted, 3); /* 01 -> 10 */
        LULL_RACE_POINT(LULL_RACE_PAGE_CLAIM);        /* a take back landing here fails the CAS */
        if (atomic_compare_exchange_weak_explicit(state, &old, old ^ flip, memory_order_acquire,
                                                  memory_order_acquire)) {
            *cut = fitted != pages;
            return n;
        }
    }
}

static size_t claim(lull_segment *s, uint32_t parked_before_ms, bool any_age, unsigned *from,
                    lull_page_run *out, size_t max) {
    lull_parked_pages *parked = lull_parked_pages_of(s);
    size_t n = 0;
    unsigned start = from ? *from : 0, next = start;
    for (unsigned w = start / 64; w < LULL_SLICE_WORDS && n < max; w++) {
        uint64_t hint = atomic_load_explicit(&parked->parked_slices[w], memory_order_seq_cst);
        /* the slices before *from: an earlier claim of this walk had them */
        if (w == start / 64) hint &= ~(uint64_t)0 << (start % 64);
        for (; hint && n < max; hint &= hint - 1) {
            unsigned slice = w * 64 + (unsigned)__builtin_ctzll(hint);
            uint64_t bit = (uint64_t)1 << (slice % 64);
            next = slice + 1;
            uint32_t word = lull_pages_word(s, slice);
            if (!(word & ~(word >> 1) & LOW_BITS)) {
                /* nothing PENDING: drop the hint, then look again, since an
                 * owner may have parked between the two reads (it sets the
                 * state before the hint) */
                atomic_fetch_and_explicit(&parked->parked_slices[w], ~bit, memory_order_seq_cst);
                word = lull_pages_word(s, slice);
                if (word & ~(word >> 1) & LOW_BITS)
                    atomic_fetch_or_explicit(&parked->parked_slices[w], bit, memory_order_seq_cst);
                continue;
            }
            uint32_t t = atomic_load_explicit(&parked->parked_ms[slice], memory_order_relaxed);
            if (!any_age && (int32_t)(parked_before_ms - t) < 0) continue; /* parked too recently */
            /* a page of a huge region waits (numa/thp.h) */
            if (!any_age && lull_thp_on() &&
                !lull_thp_pages_purgeable(
                    s, slice, (unsigned)__builtin_popcount(word & ~(word >> 1) & LOW_BITS)))
                continue;
            bool cut = false;
            size_t got = claim_slice(s, slice, out + n, max - n, &cut);
            if (got && lull_thp_on()) lull_thp_note_page_purge(s, slice);
            n += got;
            /* the run bound cut the slice: the next claim starts at it
             * again (not when this one did: it would cut it the same way,
             * and the walk would not move) */
            if (cut && slice != start) next = slice;
        }
    }
    /* short of the bound: the walk went to the segment's end; else the next
     * claim goes on after the last slice looked at (or at a cut one) */
    if (from) *from = n < max ? LULL_SLICES : next;
    if (n) LULL_RACE_POINT(LULL_RACE_PAGE_CLAIM);
    return n;
}

size_t lull_pages_claim(lull_segment *s, uint32_t parked_before_ms, unsigned *from,
                        lull_page_run *out, size_t max) {
    return claim(s, parked_before_ms, false, from, out, max);
}

size_t lull_pages_claim_all(lull_segment *s, unsigned *from, lull_page_run *out, size_t max) {
    return claim(s, 0, true, from, out, max);
}

void lull_pages_finish(const lull_page_run *r, bool purged) {
    /* PURGING is 10: to 11 (PURGED) or 01 (PENDING again) */
    uint32_t flip = lull_pages_spread(r->mask, purged ? 1 : 3);
    atomic_fetch_xor_explicit(&lull_parked_pages_of(r->segment)->page_state[r->slice], flip,
                              memory_order_release);
    if (purged) lull_resident_sub((uint64_t)__builtin_popcount(r->mask) * LULL_PAGE_SIZE);
}

void lull_pages_refused(const lull_page_run *r, uint32_t now_ms) {
    /* before the state: the claim that sees the pages PENDING again sees
     * the time (release, below; claims are the step lock's anyway) */
    atomic_store_explicit(&lull_parked_pages_of(r->segment)->parked_ms[r->slice], now_ms,
                          memory_order_relaxed);
    lull_pages_finish(r, false);
}

void *lull_page_run_address(const lull_page_run *r, size_t *len) {
    *len = (size_t)__builtin_popcount(r->mask) * LULL_PAGE_SIZE;
    return (char *)r->segment + ((size_t)r->slice << LULL_SLICE_SHIFT) +
           (size_t)__builtin_ctz(r->mask) * LULL_PAGE_SIZE;
}

uint64_t lull_pages_purged_bytes_from(const lull_segment *s, unsigned first, unsigned n,
                                      uint64_t from) {
    uint64_t bytes = 0;
    for (unsigned i = first; i < first + n && i < LULL_SLICES; i++)
        for (uint32_t high = lull_pages_word(s, i) & ~LOW_BITS; high; high &= high - 1) {
            uint64_t start = ((uint64_t)(i - first) << LULL_SLICE_SHIFT) +
                             (uint64_t)(__builtin_ctz(high) / 2) * LULL_PAGE_SIZE;
            uint64_t end = start + LULL_PAGE_SIZE;
            if (end > from) bytes += end - (start > from ? start : from);
        }
    return bytes;
}

uint64_t lull_pages_purged_bytes(const lull_segment *s, unsigned first, unsigned n) {
    uint64_t pages = 0;
    for (unsigned i = first; i < first + n && i < LULL_SLICES; i++) {
        uint32_t word = lull_pages_word(s, i);
        pages += (unsigned)__builtin_popcount(word & ~LOW_BITS); /* the high bit: PURGING, PURGED */
    }
    return pages * LULL_PAGE_SIZE;
}
