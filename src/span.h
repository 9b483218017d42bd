/* Inline helpers on blocks and spans shared by the malloc and free paths.
 *
 * Free-list links are safe-linked (as glibc does): a block stores
 * next ^ key, the key being 9 times its own address (lull_link_key). A
 * stray write of a plain pointer into a free block then decodes to
 * garbage instead of steering malloc to an address of the attacker's
 * choice, and a live block's first word rarely decodes to an address in
 * its own segment, which makes the double-free check on free one compare
 * in the common case. */
#ifndef LULL_SPAN_H
#define LULL_SPAN_H

#include "base/asm_operands.h"
#include "base/prefetch.h"
#include "numa/span_table.h"
#include "base/types.h"

/* The key of a block's links. glibc's is the address >> 12: what the key
 * hides is in the address's high bits (the randomised part), which both
 * carry. 9 times the address is one `lea`, where the shift needs a copy of
 * the address first: 1 instruction fewer in malloc and in free
 * (callgrind). A zero word never decodes to a link in its own segment (9 b
 * is at least b + 2^28 for a b above 32 MiB), and a pointer p does only if
 * p ^ 9 b lies in b's segment, that is if p is near 9 b ^ b: above the
 * 47-bit user address space for segments at lull's usual addresses (near
 * 2^47), and far from its segments for any b. */
static inline uintptr_t lull_link_key(const void *b) {
    return (uintptr_t)b * 9;
}

static inline lull_block *lull_block_next(const lull_block *b) {
    return (lull_block *)(b->next_encoded ^ lull_link_key(b));
}

static inline void lull_block_set_next(lull_block *b, lull_block *next) {
    b->next_encoded = (uintptr_t)next ^ lull_link_key(b);
}

/* Blocks handed out and not freed locally. */
static inline uint32_t lull_span_used(const lull_span *s) {
    return (s->used & ~LULL_SPAN_SLOW_FREE) + s->park_at;
}

static inline bool lull_span_in_full(const lull_span *s) {
    return s->in_full;
}

/* LULL_SPAN_SLOW_FREE follows in_full and parking. */
static inline void lull_span_update_slow(lull_span *s) {
    if (s->in_full || s->parking)
        s->used |= LULL_SPAN_SLOW_FREE;
    else
        s->used &= ~LULL_SPAN_SLOW_FREE;
}

/* Has free blocks for malloc: on its list, or recorded while parking
 * (then every carved block not in use is in the bitmap). */
static inline bool lull_span_has_free(const lull_span *s) {
    return s->free || (s->parking && lull_span_used(s) < s->carved);
}

static inline void lull_span_set_in_full(lull_span *s, bool on) {
    s->in_full = on;
    lull_span_update_slow(s);
}

/* The count at which the next park is due (at most the count now). */
static inline void lull_span_set_park_at(lull_span *s, uint32_t park_at) {
    uint32_t real = lull_span_used(s);
    s->park_at = park_at;
    s->used = (s->used & LULL_SPAN_SLOW_FREE) | (real - park_at);
}

/* n blocks fewer in use at once (remote frees merged): a park passed over
 * is due at the next free. */
static inline void lull_span_unuse(lull_span *s, uint32_t n) {
    uint32_t real = lull_span_used(s) - n;
    /* at park_at too: `used` would be left at 0, and the next free would
     * take it below zero */
    if (s->park_at >= real) s->park_at = real ? real - 1 : 0;
    s->used = (s->used & LULL_SPAN_SLOW_FREE) | (real - s->park_at);
}

/* --used; true when the span became empty, reached its park_at, or is on
 * its heap's full list or has parked pages (LULL_SPAN_SLOW_FREE makes used
 * negative as a signed number). On x86-64 the
 * flags of the decrement answer that: 2 instructions instead of 5 (gcc
 * reloads and tests a `(int32_t)--used <= 0`, since it cannot know that used
 * never wraps). Sanitizer builds use the plain C, which they can see. */
static inline bool lull_span_put_back_one(lull_span *s) {
#if LULL_ASM_OPERANDS
    bool empty_or_full;
    __asm__("subl $1, %0" : "+m"(s->used), "=@ccle"(empty_or_full));
    return empty_or_full;
#else
    return (int32_t)--s->used <= 0;
#endif
}

static inline lull_segment *lull_segment_of(const void *p) {
    return (lull_segment *)((uintptr_t)p & ~LULL_SEGMENT_MASK);
}

/* The span of the block at `offset` (its low LULL_SEGMENT_SHIFT bits, the
 * rest ignored) in segment s. */
static inline lull_span *lull_span_at(lull_segment *s, uintptr_t offset) {
    lull_span_table *table = lull_span_table_of(s);
    uint16_t off = table->span_head[(offset & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT];
    return (lull_span *)((char *)table->slices + off);
}

static inline lull_span *lull_span_of(lull_segment *s, const void *p) {
    return lull_span_at(s, (uintptr_t)p);
}

static inline uint8_t *lull_span_start(const lull_span *span) {
    lull_segment *s = lull_segment_of(span);
    return (uint8_t *)s + ((size_t)(span - lull_span_table_of(s)->slices) << LULL_SLICE_SHIFT);
}

static inline size_t lull_span_bytes(const lull_span *span) {
    return (size_t)span->slice_count << LULL_SLICE_SHIFT;
}

/* True when p is not the start of a block of the small span: its offset in
 * the span is not a multiple of the block size. Lemire's divisibility test
 * (n % d == 0 exactly when n * ceil(2^64 / d) mod 2^64 < ceil(2^64 / d), for
 * n < 2^32): one multiply and no division, and no load of the block. The
 * offset n = p - start is never formed: n * magic = p * magic - start *
 * magic (mod 2^64), and the descriptor keeps start * magic (one instruction
 * fewer than masking p and subtracting the span's offset).
 * tests/test_block_misaligned.c checks it against `%` for every class.
 * Testing the product's high half instead (a block start's is below the
 * span's size, any other offset's at least the magic) is one instruction
 * fewer, but the shift does not fuse with the branch as the compare does:
 * bench_throughput st ran 1.7 % slower with it (15 paired runs). */
static inline bool lull_block_misaligned(const lull_span *span, const void *p) {
#if LULL_ASM_OPERANDS
    /* the magic read twice, as the multiply's and the compare's operand:
     * gcc keeps it in a register instead (1 instruction more) */
    uint64_t x = (uintptr_t)p;
    bool misaligned;
    __asm__("imul %[magic], %[x]\n\tsub %[start], %[x]\n\tcmp %[magic], %[x]"
            : [x] "+r"(x), "=@ccae"(misaligned)
            : [magic] "m"(span->div_magic), [start] "m"(span->start_magic));
    return misaligned;
#else
    return (uint64_t)(uintptr_t)p * span->div_magic - span->start_magic >= span->div_magic;
#endif
}

/* Is h the span's owner? The owner's free asks first. The field is the
 * compare's operand (1 instruction fewer; base/asm_operands.h). */
static inline bool lull_span_owned_by(const lull_span *span, const struct lull_heap *h) {
#if LULL_ASM_OPERANDS
    bool mine;
    __asm__("cmp %[owner], %[h]" : "=@ccz"(mine) : [owner] "m"(span->heap), [h] "r"(h));
    return mine;
#else
    return atomic_load_explicit(&span->heap, memory_order_relaxed) == h;
#endif
}

/* A block in a remote-free message (src/outbox.c). Its first word links to
 * the block's own address with bit 24 flipped: 16 MiB away, in the same
 * segment (so lull_block_looks_free() takes it for free, and a second free
 * of the block, by anyone, is checked) but never in the same span (spans are
 * at most 4 MiB), so no free-list link, stale or current, reads as the mark,
 * even with its low bytes overwritten by the block's new user. Its second
 * word links to the next block of the message, safe-linked. Blocks of 16
 * bytes or more. */
/* Is b on the span's local free list? The owner's walk, at most
 * `capacity` links (a list made circular by a double free ends too). */
static inline bool lull_span_free_list_has(const lull_span *span, const lull_block *b) {
    uint32_t limit = span->capacity;
    for (const lull_block *f = span->free; f && limit--; f = lull_block_next(f))
        if (f == b) return true;
    return false;
}

#define LULL_MESSAGE_MARK ((uintptr_t)1 << 24)
_Static_assert(LULL_MESSAGE_MARK < LULL_SEGMENT_SIZE, "the mark stays in the block's segment");
_Static_assert(64 * LULL_SLICE_SIZE <= LULL_MESSAGE_MARK, "the mark is outside every span");

static inline void lull_message_link(lull_block *b, lull_block *next) {
    lull_block_set_next(b, (lull_block *)((uintptr_t)b ^ LULL_MESSAGE_MARK));
    (&b->next_encoded)[1] = (uintptr_t)next ^ lull_link_key(b);
}

static inline lull_block *lull_message_next(const lull_block *b) {
    return (lull_block *)((&b->next_encoded)[1] ^ lull_link_key(b));
}

/* A message block's prefetch hints: the blocks two and three ahead in its
 * message, in its third and fourth words when it has them (blocks of 24
 * and of 32 bytes and more), written as the sender links it
 * (src/outbox.c). The owner walks a message through its blocks' links,
 * each a miss (another core wrote the block last), one after the other;
 * with the hints it asks for the next blocks' lines while it applies this
 * one (heap.c, apply_inbox). Hints are only ever prefetched, never
 * followed: one that is stale, NULL or overwritten (a write after the
 * free) costs a prefetch that fetches nothing useful, and a prefetch
 * never faults. */
static inline void lull_message_set_hints(lull_block *b, uint32_t block_size,
                                          const lull_block *next) {
    if (block_size < 3 * sizeof(uintptr_t)) return;
    uintptr_t *word = &b->next_encoded;
    const lull_block *ahead2 = next ? lull_message_next(next) : NULL;
    word[2] = (uintptr_t)ahead2;
    if (block_size >= 4 * sizeof(uintptr_t))
        word[3] = (uintptr_t)(ahead2 ? lull_message_next(ahead2) : NULL);
}

static inline void lull_message_prefetch_hints(const lull_block *b, uint32_t block_size) {
    if (block_size < 3 * sizeof(uintptr_t)) return;
    const uintptr_t *word = &b->next_encoded;
    lull_prefetch_for_write((const void *)word[2]);
    if (block_size >= 4 * sizeof(uintptr_t)) lull_prefetch_for_write((const void *)word[3]);
}

static inline bool lull_block_in_message(const lull_block *b) {
    return (uintptr_t)lull_block_next(b) == ((uintptr_t)b ^ LULL_MESSAGE_MARK);
}

static inline lull_block *lull_remote_head(uintptr_t word) {
    return (lull_block *)(word & ~LULL_REMOTE_QUEUED);
}

/* True when a stale first word of a block being freed decodes to an address
 * in the block's own segment: the block may already be on a free list. */
static inline bool lull_block_looks_free(const lull_block *b) {
#if LULL_ASM_OPERANDS
    /* the decoding xor's flags tell next == 0 (gcc compares again: 1
     * instruction more; base/asm_operands.h). `volatile`: gcc 12 removed
     * the statement without it (its output is unused), and the checks
     * with it (test_free_errors: 5 double frees went unseen) */
    uintptr_t t;
    __asm__ volatile goto("mov %[word], %[t]\n\t"
                          "xor %[key], %[t]\n\t"
                          "je %l[looks_free]\n\t"
                          "xor %[b], %[t]\n\t"
                          "shr %[shift], %[t]\n\t"
                          "je %l[looks_free]"
                          : [t] "=&r"(t)
                          : [word] "m"(b->next_encoded), [key] "r"(lull_link_key(b)), [b] "r"(b),
                            [shift] "i"(LULL_SEGMENT_SHIFT)
                          : "cc"
                          : looks_free);
    (void)t;
    return false;
looks_free:
    return true;
#else
    uintptr_t next = (uintptr_t)lull_block_next(b);
    /* next == 0: the last block of a free list (its word is the key) */
    return next == 0 || ((next ^ (uintptr_t)b) >> LULL_SEGMENT_SHIFT) == 0;
#endif
}

#endif
