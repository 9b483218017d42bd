/* Parked pages, the owner's side; see span_park.h.
 *
 * Why a bitmap in the span rather than passes over its free list: finding
 * the pages with no live block from the list means walking it, one cache
 * miss a link in a list in free order, and a walk at every 32nd of the
 * span made bench/footprint's survivors_small 5.8 times slower (0.72
 * against 0.125 s; park_free_pages was half the samples). Parking costs one
 * walk when it starts and a few instructions a free after that, and a page
 * goes back the moment its last live block is freed. */
#include "src/span_park.h"
#include "base/message.h"
#include "numa/arena.h"
#include "numa/page_park.h"
#include "src/size_class.h"
#include "src/span.h"

#define MAX_PAGES (64 * LULL_PAGES_PER_SLICE) /* a span is at most 64 slices */
#define NEVER 255                             /* live count of a page that never parks */

static inline unsigned first_slice(const lull_span *s) {
    return (unsigned)(s - lull_span_table_of(lull_segment_of(s))->slices);
}

/* This module's part of a segment (base/types.h, LULL_META_PARK_ROWS): a
 * row a slice, and a parking span's rows together hold its free bitmap (a
 * bit a block), then a live count a page. Only the span's owner touches
 * them. */
typedef struct park_rows {
    _Alignas(8) uint8_t row[LULL_SLICES][LULL_PARK_META_BYTES];
} park_rows;
LULL_META_PART_CHECK(park_rows, PARK_ROWS);

static inline park_rows *park_rows_of(const lull_segment *seg) {
    return lull_segment_part(seg, LULL_META_PARK_ROWS_AT);
}

static inline uint64_t *bitmap_of(const lull_span *s) {
    return (uint64_t *)park_rows_of(lull_segment_of(s))->row[first_slice(s)];
}

static inline size_t bitmap_words(const lull_span *s) {
    return ((size_t)s->capacity + 63) / 64;
}

static inline uint8_t *live_of(const lull_span *s) {
    return (uint8_t *)(bitmap_of(s) + bitmap_words(s));
}

/* a page overlaps at most 4096 / 112 + 2 = 38 blocks of the smallest class
 * that parks: its count stays below NEVER */
static inline size_t span_pages(const lull_span *s) {
    return (size_t)s->slice_count * LULL_PAGES_PER_SLICE;
}

static inline size_t block_at(const lull_span *s, size_t off) {
    return (size_t)(((unsigned __int128)off * s->div_magic) >> 64); /* off / block_size */
}

static void park_page(lull_span *s, size_t p, uint32_t now) {
    lull_pages_park(lull_segment_of(s), first_slice(s) + (unsigned)(p / LULL_PAGES_PER_SLICE),
                    1u << (p % LULL_PAGES_PER_SLICE), now);
    s->parked_pages++;
}

static bool page_out(const lull_span *s, size_t p) {
    uint32_t word =
        lull_pages_word(lull_segment_of(s), first_slice(s) + (unsigned)(p / LULL_PAGES_PER_SLICE));
    return word >> (2 * (p % LULL_PAGES_PER_SLICE)) & 3;
}

void lull_span_park_arm(lull_span *s) {
    const lull_class_info *ci = &lull_classes[s->size_class];
    uint32_t real = lull_span_used(s);
    if (s->kept || s->parking || !ci->park_start || ci->park_start >= real) return;
    lull_span_set_park_at(s, ci->park_start);
}

/* Does the first word of the block at `off` read as a free-list link: to
 * nothing, or to a block start of this span? Every block on the list does;
 * a live block only if its data happens to. */
__attribute__((no_sanitize("thread"))) static bool looks_listed(const lull_span *s, uint8_t *start,
                                                                size_t off, size_t end) {
    const lull_block *b = (const lull_block *)(start + off);
    /* racy by design: another thread may be writing a live block now */
    uintptr_t next = __atomic_load_n(&b->next_encoded, __ATOMIC_RELAXED) ^ lull_link_key(b);
    return next == 0 || (next >= (uintptr_t)start && next < (uintptr_t)start + end &&
                         !lull_block_misaligned(s, (const void *)next));
}

/* The free blocks into the bitmap. A sweep of the blocks' first words in
 * address order finds every listed block and, unless a live block's data
 * reads as a link, nothing else: when it finds exactly as many as are
 * free, it found them. Otherwise (or with remote frees not collected yet,
 * whose blocks link to each other) the list is walked: one cache miss a
 * link in free order, which made bench/footprint's small_single 1.9 times
 * slower than the sweep. */
static void bitmap_from_list(lull_span *s, uint64_t *bits) {
    uint8_t *start = lull_span_start(s);
    uint32_t bs = s->block_size, found = 0, want = s->carved - lull_span_used(s);
    size_t end = (size_t)s->carved * bs, off = 0;
    for (uint32_t i = 0; i < s->carved; i++, off += bs)
        if (looks_listed(s, start, off, end)) {
            bits[i / 64] |= (uint64_t)1 << (i % 64);
            found++;
        }
    if (found == want) return;
    for (size_t w = 0; w < bitmap_words(s); w++)
        bits[w] = 0;
    uint32_t left = s->capacity;
    for (lull_block *f = s->free; f && left--; f = lull_block_next(f)) {
        size_t i = block_at(s, (size_t)((uint8_t *)f - start));
        bits[i / 64] |= (uint64_t)1 << (i % 64);
    }
}

void lull_span_park_start(lull_span *s) {
    lull_span_set_park_at(s, 0);
    if (s->parking) return;
    uint32_t bs = s->block_size;
    s->parking = 1;
    atomic_store_explicit(&s->parks, 1, memory_order_relaxed);
    uint64_t *bits = bitmap_of(s);
    uint8_t *live = live_of(s);
    for (size_t w = 0; w < bitmap_words(s); w++)
        bits[w] = 0;
    bitmap_from_list(s, bits);
    s->free = NULL;
    /* live counts: every carved block not free; a page the next carve
     * would write into never parks */
    size_t pages = span_pages(s);
    size_t limit = s->carved == s->capacity ? lull_span_bytes(s) : (size_t)s->carved * bs;
    for (size_t p = 0; p < pages; p++)
        live[p] = (p + 1) * LULL_PAGE_SIZE <= limit ? 0 : NEVER;
    size_t off = 0;
    for (uint32_t i = 0; i < s->carved; i++, off += bs) {
        if (bits[i / 64] >> (i % 64) & 1) continue;
        for (size_t p = off / LULL_PAGE_SIZE; p <= (off + bs - 1) / LULL_PAGE_SIZE; p++)
            if (live[p] != NEVER) live[p]++;
    }
    uint32_t now = lull_now_ms();
    for (size_t p = 0; p < pages; p++)
        if (live[p] == 0) park_page(s, p, now);
    lull_span_update_slow(s);
}

void lull_span_park_absorb(lull_span *s) {
    uint8_t *start = lull_span_start(s);
    uint32_t bs = s->block_size, now = 0;
    uint64_t *bits = bitmap_of(s);
    uint8_t *live = live_of(s);
    uint32_t left = s->capacity;
    for (lull_block *b = s->free, *next; b && left--; b = next) {
        next = lull_block_next(b);
        size_t off = (size_t)((uint8_t *)b - start), i = block_at(s, off);
        if (bits[i / 64] >> (i % 64) & 1)
            lull_fatal("free(): double free of %p (block of %u bytes%s)", (void *)b, bs,
                       lull_span_block_on_parked_page(s, b) ? ", on a page given back" : "");
        bits[i / 64] |= (uint64_t)1 << (i % 64);
        for (size_t p = off / LULL_PAGE_SIZE; p <= (off + bs - 1) / LULL_PAGE_SIZE; p++)
            if (live[p] != NEVER && --live[p] == 0) {
                if (!now) now = lull_now_ms();
                park_page(s, p, now);
            }
    }
    s->free = NULL;
}

bool lull_span_block_on_parked_page(const lull_span *s, const void *p) {
    size_t off = (size_t)((const uint8_t *)p - lull_span_start(s));
    for (size_t pg = off / LULL_PAGE_SIZE; pg <= (off + s->block_size - 1) / LULL_PAGE_SIZE; pg++)
        if (page_out(s, pg)) return true;
    return false;
}

/* Is every page [first, last] of the span NONE? */
static bool pages_resident(const lull_span *s, size_t first, size_t last) {
    for (size_t p = first; p <= last; p++)
        if (page_out(s, p)) return false;
    return true;
}

/* The first free block whose pages are all resident (NONE), or SIZE_MAX. */
static size_t resident_free_block(const lull_span *s) {
    const uint64_t *bits = bitmap_of(s);
    uint32_t bs = s->block_size;
    for (size_t w = 0; w < bitmap_words(s); w++)
        for (uint64_t x = bits[w]; x; x &= x - 1) {
            size_t i = w * 64 + (size_t)__builtin_ctzll(x), off = i * bs;
            if (pages_resident(s, off / LULL_PAGE_SIZE, (off + bs - 1) / LULL_PAGE_SIZE)) return i;
        }
    return SIZE_MAX;
}

bool lull_span_park_has_resident_free(const lull_span *s) {
    return resident_free_block(s) != SIZE_MAX;
}

lull_block *lull_span_park_take(lull_span *s) {
    size_t i = resident_free_block(s);
    if (i == SIZE_MAX) return NULL;
    uint64_t *bits = bitmap_of(s);
    uint8_t *live = live_of(s);
    size_t off = i * s->block_size;
    bits[i / 64] &= ~((uint64_t)1 << (i % 64));
    for (size_t p = off / LULL_PAGE_SIZE; p <= (off + s->block_size - 1) / LULL_PAGE_SIZE; p++)
        if (live[p] != NEVER) live[p]++;
    return (lull_block *)(lull_span_start(s) + off);
}

bool lull_span_parking_has(const lull_span *s, const void *p) {
    size_t i = block_at(s, (size_t)((const uint8_t *)p - lull_span_start(s)));
    return bitmap_of(s)[i / 64] >> (i % 64) & 1;
}

bool lull_span_unpark(lull_span *s, bool thread) {
    if (!s->parking) return true;
    lull_segment *seg = lull_segment_of(s);
    unsigned first = first_slice(s);
    for (unsigned k = 0; k < s->slice_count && s->parked_pages; k++)
        s->parked_pages -=
            (uint16_t)__builtin_popcount(lull_pages_take_back(seg, first + k, 0xffffu));
    if (s->parked_pages) {
        /* a page being purged: parking goes on, and the pages taken back
         * (no live block on them, their counts at 0) park again */
        uint8_t *live = live_of(s);
        uint32_t now = 0;
        for (size_t p = 0; p < span_pages(s); p++)
            if (live[p] == 0 && !page_out(s, p)) {
                if (!now) now = lull_now_ms();
                park_page(s, p, now);
            }
        return false;
    }
    if (thread) {
        /* every free block back on the list, in address order */
        uint64_t *bits = bitmap_of(s);
        uint8_t *start = lull_span_start(s);
        lull_block *list = NULL;
        for (size_t w = bitmap_words(s); w-- > 0;)
            for (uint64_t x = bits[w]; x;) {
                unsigned b = 63u - (unsigned)__builtin_clzll(x);
                x &= ~((uint64_t)1 << b);
                lull_block *blk = (lull_block *)(start + (w * 64 + b) * (size_t)s->block_size);
                lull_block_set_next(blk, list);
                list = blk;
            }
        s->free = list;
    }
    s->parking = 0;
    atomic_store_explicit(&s->parks, 0, memory_order_relaxed);
    lull_span_update_slow(s);
    return true;
}
