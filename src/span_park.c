/* Parked pages, the owner's side; see span_park.h. The passes are the slow
 * path of a free (a span's count in use reaching its park_at) and of a
 * refill (a span out of free blocks), and walk the span: bitmaps on the
 * stack, one bit a block and one a page. */
#include "src/span_park.h"
#include "base/message.h"
#include "base/race.h"
#include "numa/arena.h"
#include "numa/page_park.h"
#include "src/size_class.h"
#include "src/span.h"

#define MAX_PAGES (64 * LULL_PAGES_PER_SLICE) /* a span is at most 64 slices */
#define MAX_BLOCKS (LULL_SLICE_SIZE / 8)      /* the 8-byte class's span */
#define PAGE_WORDS (MAX_PAGES / 64)
#define BLOCK_WORDS (MAX_BLOCKS / 64)

static inline bool bit_get(const uint64_t *m, size_t i) {
    return m[i / 64] >> (i % 64) & 1;
}

static inline void bit_set(uint64_t *m, size_t i) {
    m[i / 64] |= (uint64_t)1 << (i % 64);
}

static bool any_in(const uint64_t *m, size_t first, size_t last) {
    for (size_t i = first; i <= last; i++)
        if (bit_get(m, i)) return true;
    return false;
}

/* block index of a byte offset in the span: the span's div_magic, no
 * division (exact for offsets below 2^32) */
static inline size_t block_at(const lull_span *s, size_t off) {
    return (size_t)(((unsigned __int128)off * s->div_magic) >> 64);
}

static inline unsigned first_slice(const lull_span *s) {
    return (unsigned)(s - lull_segment_of(s)->slices);
}

/* the span's pages not NONE */
static void pages_out(const lull_span *s, uint64_t *out) {
    const lull_segment *seg = lull_segment_of(s);
    unsigned first = first_slice(s);
    for (unsigned k = 0; k < s->slice_count; k++)
        out[k / 4] |= (uint64_t)lull_pages_out(lull_pages_word(seg, first + k)) << (k % 4 * 16);
}

static bool parkable(const lull_span *s) {
    return s->capacity <= MAX_BLOCKS && s->slice_count <= MAX_PAGES / LULL_PAGES_PER_SLICE &&
           s->block_size;
}

/* Park the pages, among those whose every block is carved, that no live
 * block overlaps, and take the blocks that overlap them off the list. */
static void park_free_pages(lull_span *s) {
    if (!parkable(s)) return;
    uint32_t bs = s->block_size;
    size_t limit = s->carved == s->capacity ? lull_span_bytes(s) : (size_t)s->carved * bs;
    size_t pages = limit / LULL_PAGE_SIZE;
    if (!pages) return;
    uint64_t on_list[BLOCK_WORDS] = {0}, out[PAGE_WORDS] = {0}, live[PAGE_WORDS] = {0};
    uint8_t *start = lull_span_start(s);
    uint32_t left = s->capacity;
    for (lull_block *f = s->free; f && left--; f = lull_block_next(f))
        bit_set(on_list, block_at(s, (size_t)((uint8_t *)f - start)));
    pages_out(s, out);
    /* live: neither on the list nor over a parked page (which only free
     * blocks overlap) */
    size_t off = 0;
    for (uint32_t i = 0; i < s->carved; i++, off += bs) {
        size_t first = off / LULL_PAGE_SIZE, last = (off + bs - 1) / LULL_PAGE_SIZE;
        if (bit_get(on_list, i) || any_in(out, first, last)) continue;
        for (size_t p = first; p <= last && p < MAX_PAGES; p++)
            bit_set(live, p);
    }
    uint64_t park[PAGE_WORDS] = {0};
    unsigned count = 0;
    for (size_t p = 0; p < pages; p++)
        if (!bit_get(live, p) && !bit_get(out, p)) {
            bit_set(park, p);
            count++;
        }
    if (!count) return;
    lull_block *head = NULL, *tail = NULL;
    left = s->capacity;
    for (lull_block *f = s->free, *next; f && left--; f = next) {
        next = lull_block_next(f);
        size_t o = (size_t)((uint8_t *)f - start);
        if (any_in(park, o / LULL_PAGE_SIZE, (o + bs - 1) / LULL_PAGE_SIZE)) continue;
        if (tail)
            lull_block_set_next(tail, f);
        else
            head = f;
        tail = f;
    }
    if (tail) lull_block_set_next(tail, NULL);
    s->free = head;
    lull_segment *seg = lull_segment_of(s);
    unsigned first = first_slice(s);
    uint32_t now = lull_now_ms();
    for (unsigned k = 0; k < s->slice_count; k++) {
        uint32_t m = (uint32_t)(park[k / 4] >> (k % 4 * 16)) & 0xffffu;
        if (m) lull_pages_park(seg, first + k, m, now);
    }
    s->parked_pages += count;
    lull_span_update_slow(s);
}

void lull_span_park_arm(lull_span *s) {
    const lull_class_info *ci = &lull_classes[s->size_class];
    int64_t real = lull_span_used(s), at = ci->park_start, step = ci->park_step;
    if (s->kept || !at || !parkable(s)) return;
    /* the first of park_start, park_start - step, ... below the count */
    if (at >= real) at -= ((at - real) / step + 1) * step;
    if (at > 0) lull_span_set_park_at(s, (uint32_t)at);
}

void lull_span_park_due(lull_span *s) {
    park_free_pages(s);
    uint32_t step = lull_classes[s->size_class].park_step;
    lull_span_set_park_at(s, s->park_at > step ? s->park_at - step : 0);
}

void lull_span_park_now(lull_span *s) {
    if (!s->kept) park_free_pages(s);
}

bool lull_span_unpark(lull_span *s) {
    if (!s->parked_pages) return true;
    lull_segment *seg = lull_segment_of(s);
    unsigned first = first_slice(s);
    uint64_t taken[PAGE_WORDS] = {0}, out[PAGE_WORDS] = {0};
    unsigned count = 0;
    for (unsigned k = 0; k < s->slice_count; k++) {
        uint32_t m = lull_pages_take_back(seg, first + k, 0xffffu);
        taken[k / 4] |= (uint64_t)m << (k % 4 * 16);
        count += (unsigned)__builtin_popcount(m);
    }
    if (count) {
        LULL_RACE_POINT(LULL_RACE_PAGE_TAKE_BACK);
        s->parked_pages -= count;
        pages_out(s, out); /* the pages the reclaim thread is purging now */
        uint32_t bs = s->block_size;
        uint8_t *start = lull_span_start(s);
        size_t pages = (size_t)s->slice_count * LULL_PAGES_PER_SLICE, next_block = 0;
        for (size_t p = 0; p < pages; p++) {
            if (!bit_get(taken, p)) continue;
            size_t fb = block_at(s, p * LULL_PAGE_SIZE);
            size_t lb = block_at(s, (p + 1) * LULL_PAGE_SIZE - 1);
            if (lb >= s->carved) lb = s->carved - 1;
            for (size_t i = fb > next_block ? fb : next_block; i <= lb && i < s->carved; i++) {
                size_t o = i * bs;
                if (any_in(out, o / LULL_PAGE_SIZE, (o + bs - 1) / LULL_PAGE_SIZE)) continue;
                lull_block *b = (lull_block *)(start + o);
                lull_block_set_next(b, s->free);
                s->free = b;
            }
            if (lb + 1 > next_block) next_block = lb + 1;
        }
    }
    lull_span_update_slow(s);
    return s->parked_pages == 0;
}

void lull_span_check_not_parked(const lull_span *s, const lull_block *b) {
    const lull_segment *seg = lull_segment_of(s);
    size_t off = (size_t)((const uint8_t *)b - lull_span_start(s));
    unsigned first = first_slice(s);
    for (size_t p = off / LULL_PAGE_SIZE; p <= (off + s->block_size - 1) / LULL_PAGE_SIZE; p++) {
        uint32_t word = lull_pages_word(seg, first + (unsigned)(p / LULL_PAGES_PER_SLICE));
        if (word >> (2 * (p % LULL_PAGES_PER_SLICE)) & 3)
            lull_fatal("free(): double free of %p (block of %u bytes, on a page given back)",
                       (const void *)b, s->block_size);
    }
}
