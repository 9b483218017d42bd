/* Size-class tables; see size_class.h. Built once at start: a few hundred
 * instructions, and no table to keep in step by hand. */
#include "src/size_class.h"

lull_class_info lull_classes[LULL_CLASSES];
uint8_t lull_small_class_of[129];
uint8_t lull_class_first_word[LULL_CLASSES], lull_class_last_word[LULL_CLASSES];
unsigned lull_class_count;

static uint16_t span_slices_for(uint32_t size) {
    /* at least 4 blocks per span (many more for small sizes), then the
     * length up to twice that which leaves the smallest tail */
    size_t min = ((size_t)size * 4 + LULL_SLICE_SIZE - 1) / LULL_SLICE_SIZE;
    if (min == 0) min = 1;
    if ((min * LULL_SLICE_SIZE) % size * 32 <= min * LULL_SLICE_SIZE) return (uint16_t)min;
    size_t best = min, best_tail = LULL_SEGMENT_SIZE;
    for (size_t n = min; n <= 2 * min && n <= 64; n++) {
        size_t bytes = n * LULL_SLICE_SIZE;
        size_t tail = bytes % size;
        if (tail * best < best_tail * n) { /* compare tail fractions */
            best = n;
            best_tail = tail;
        }
    }
    return (uint16_t)best;
}

/* The fraction of blocks in use below which a page of the span holds no
 * live block with some chance: with k blocks a page and a fraction u in
 * use at random, a page is all free with probability (1 - u)^k; parks
 * start where that reaches 5 % (u = 0.95 for blocks of a page or more,
 * 0.53 for 1 KiB blocks, 0.17 for 256 B, 0.05 for 64 B). In 64ths. */
static uint32_t park_start_for(uint32_t size, uint32_t capacity) {
    uint32_t k = size >= LULL_PAGE_SIZE ? 1 : (uint32_t)(LULL_PAGE_SIZE / size);
    uint32_t best = 0;
    for (uint32_t j = 1; j < 64; j++) {
        double all_free = 1.0, u = j / 64.0;
        for (uint32_t i = 0; i < k && all_free >= 0.05; i++)
            all_free *= 1.0 - u;
        if (all_free >= 0.05) best = j;
    }
    return (uint32_t)((uint64_t)capacity * best / 64);
}

static void add_class(uint32_t size) {
    lull_class_info *c = &lull_classes[lull_class_count++];
    c->block_size = size;
    c->span_slices = span_slices_for(size);
    c->capacity = (uint32_t)(c->span_slices * LULL_SLICE_SIZE / size);
    c->div_magic = UINT64_MAX / size + 1;
    /* src/span_park.h: one block holds the span's free bitmap and page
     * counts while it parks, in spans of at most 64 slices */
    size_t meta =
        ((size_t)c->capacity + 63) / 64 * 8 + (size_t)c->span_slices * LULL_PAGES_PER_SLICE;
    c->park_start = meta <= size && c->span_slices <= 64 ? park_start_for(size, c->capacity) : 0;
}

void lull_size_classes_init(void) {
    if (lull_class_count) return;
    lull_class_count = 1; /* class 0 is unused: a zero-size request is class 1 */
    lull_classes[0] = (lull_class_info){0};
    /* 8, then 16-byte steps: C17 asks malloc(24) to be aligned for a
     * long double (16 bytes), so no class above 8 may be 8-aligned only */
    add_class(8);
    for (uint32_t s = 16; s <= 128; s += 16)
        add_class(s);
    for (uint32_t base = 128; base < LULL_SMALL_MAX; base *= 2)
        for (uint32_t k = 1; k <= 8; k++)
            add_class(base + k * (base / 8));
    /* lookup for sizes up to 1 KiB */
    unsigned c = 1;
    for (unsigned i = 0; i <= 128; i++) {
        size_t size = i * 8;
        while (lull_classes[c].block_size < size)
            c++;
        lull_small_class_of[i] = (uint8_t)c;
    }
    lull_small_class_of[0] = 1;
    for (unsigned k = 0; k < LULL_CLASSES; k++) {
        lull_class_first_word[k] = 1;
        lull_class_last_word[k] = 0;
    }
    for (unsigned i = 129; i-- > 0;) {
        unsigned k = lull_small_class_of[i];
        lull_class_first_word[k] = (uint8_t)i;
        if (lull_class_last_word[k] < lull_class_first_word[k])
            lull_class_last_word[k] = (uint8_t)i;
    }
}
