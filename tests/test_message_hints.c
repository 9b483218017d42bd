/* A remote-free message's prefetch hints (src/span.h,
 * lull_message_set_hints): as src/outbox.c links each block in front of
 * its message, the block's third and fourth words name the blocks two and
 * three ahead, so that the owner's walk (src/heap.c, apply_inbox) asks for
 * them early. Checked on plain memory laid out as a span of one class: the
 * hints of every block, the NULLs at the message's end, and that a block
 * too small for a hint word keeps its neighbour's words untouched (the
 * hint words are inside the block, or not written). */
#include "src/span.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define BLOCKS 6
#define CANARY ((uintptr_t)0x5a5a5a5a5a5a5a5aULL)

static _Alignas(64) uintptr_t memory[BLOCKS * 8 + 8];

/* Blocks of `size` bytes one after the other, every word a canary; each
 * linked in front of the message the way lull_outbox_put does. Returns
 * the message's head (the last block linked). */
static lull_block *build_message(uint32_t size, lull_block *blocks[BLOCKS]) {
    for (size_t i = 0; i < sizeof memory / sizeof memory[0]; i++)
        memory[i] = CANARY;
    lull_block *head = NULL;
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = (lull_block *)((char *)memory + (size_t)i * size);
        lull_message_link(blocks[i], head);
        lull_message_set_hints(blocks[i], size, head);
        head = blocks[i];
    }
    return head;
}

static uintptr_t word(const lull_block *b, int i) {
    return (&b->next_encoded)[i];
}

/* The message runs from blocks[BLOCKS - 1] down to blocks[0]. */
static const lull_block *ahead(lull_block *blocks[BLOCKS], int i, int n) {
    return i - n >= 0 ? blocks[i - n] : NULL;
}

Test(message_hints, blocks_of_32_bytes_name_the_blocks_two_and_three_ahead) {
    lull_block *blocks[BLOCKS];
    lull_block *head = build_message(32, blocks);
    int i = BLOCKS - 1;
    for (const lull_block *b = head; b; b = lull_message_next(b), i--) {
        cr_assert_geq(i, 0, "the message is longer than its blocks");
        cr_assert_eq((const void *)b, (const void *)blocks[i]);
        cr_expect(lull_block_in_message(b), "block %d lost its message mark", i);
        cr_expect_eq(word(b, 2), (uintptr_t)ahead(blocks, i, 2), "block %d: two ahead", i);
        cr_expect_eq(word(b, 3), (uintptr_t)ahead(blocks, i, 3), "block %d: three ahead", i);
    }
    cr_assert_eq(i, -1, "the walk missed %d blocks", i + 1);
}

Test(message_hints, blocks_of_24_bytes_get_one_hint_and_keep_the_next_block_intact) {
    lull_block *blocks[BLOCKS];
    lull_block *head = build_message(24, blocks);
    int i = BLOCKS - 1;
    for (const lull_block *b = head; b; b = lull_message_next(b), i--) {
        cr_expect(lull_block_in_message(b), "block %d lost its message mark", i);
        cr_expect_eq(word(b, 2), (uintptr_t)ahead(blocks, i, 2), "block %d: two ahead", i);
    }
    cr_assert_eq(i, -1);
    /* the word after the last block: no fourth word was written there */
    cr_expect_eq(memory[BLOCKS * 3], CANARY, "a 24-byte block wrote past its end");
}

Test(message_hints, blocks_of_16_bytes_get_none) {
    lull_block *blocks[BLOCKS];
    build_message(16, blocks);
    cr_expect_eq(memory[BLOCKS * 2], CANARY, "a 16-byte block wrote past its end");
    for (int i = 0; i < BLOCKS; i++)
        cr_expect(lull_block_in_message(blocks[i]), "block %d lost its message mark", i);
}

/* Hints are prefetched, never followed: any value, even one that is no
 * address at all, is safe to hand to lull_message_prefetch_hints. */
Test(message_hints, any_hint_value_is_safe_to_prefetch) {
    static _Alignas(64) uintptr_t block[4];
    static const uintptr_t values[] = {0, 1, CANARY, UINTPTR_MAX, (uintptr_t)1 << 63};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        block[2] = block[3] = values[i];
        /* opaque to the compiler, as a message block is: else it sees the
         * constant and warns of a prefetch out of bounds */
        const lull_block *b = (const lull_block *)block;
        __asm__ volatile("" : "+r"(b) : : "memory");
        lull_message_prefetch_hints(b, 32);
    }
}
