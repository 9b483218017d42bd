/* fork() while another thread is inside a remote free onto a span's own
 * list (8-byte blocks: src/alloc.c's remote_free), held by the race
 * harness between the CAS that put the block on the span's list and set
 * LULL_REMOTE_QUEUED, and the push of the span onto its owner heap's
 * remote_spans (base/race.h, point remote_queue; a -DLULL_RACE=ON build).
 *
 * The owner is the forking thread, so in the child its heap is the one in
 * use. A child copied inside that window had the span queued and on no
 * list: a direct collection took the block back and left the bit, and the
 * span was never released there (docs/architecture.md, "fork").
 *
 * Each trial: the main thread fills a span of 8-byte blocks, a thread of
 * its own frees one of them and is held at the point (or runs through it,
 * a quarter of the seeds: base/race.c); the main thread forks once the
 * point is reached. The child frees every other block of the span,
 * collects, and must have released the span. Bounded by trials (SEEDS),
 * not by time. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/span.h"

#include "tests/support/race_fork.h"

#include <criterion/criterion.h>
#include <stdatomic.h>

#define SEEDS 16
#define SPAN_BLOCKS 8192 /* 8-byte blocks in a span (64 KiB) */
#define BLOCKS (2 * SPAN_BLOCKS + 1)

static void *blocks[BLOCKS];

static lull_span *span_of(void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

/* A span every block of which the main thread holds: two spans' worth
 * allocated fill one at least. Returns the index of one of its blocks. */
static int block_of_a_full_span(void) {
    for (int i = 0; i < BLOCKS; i++) {
        blocks[i] = lull_malloc(8);
        cr_assert_not_null(blocks[i]);
    }
    for (int i = 0; i < BLOCKS; i++) {
        lull_span *s = span_of(blocks[i]);
        int n = 0;
        for (int j = 0; j < BLOCKS; j++)
            n += span_of(blocks[j]) == s;
        if (n == SPAN_BLOCKS) return i;
    }
    cr_assert_fail("no span of 8-byte blocks is all the main thread's");
    return -1;
}

static void *free_one(void *p) {
    lull_free(p);
    return NULL;
}

static int victim;

/* The child: frees the span's other blocks and collects. 0 the span went
 * back to its arena, 1 it is still its heap's. */
static int child_check(void *span) {
    for (int i = 0; i < BLOCKS; i++)
        if (i != victim) lull_free(blocks[i]);
    lull_thread_collect();
    return atomic_load(&((lull_span *)span)->heap) != NULL;
}

/* One trial (seed s): 1 if the child kept the span. */
static int fork_inside_a_remote_free(uint64_t s) {
    victim = block_of_a_full_span();
    int kept = race_fork_at(LULL_RACE_REMOTE_QUEUE, 0xf0de0ULL * (s + 1), free_one, blocks[victim],
                            child_check, span_of(blocks[victim]), NULL);
    for (int i = 0; i < BLOCKS; i++)
        if (i != victim) lull_free(blocks[i]);
    lull_thread_collect();
    return kept;
}

Test(race_fork_remote, fork_while_another_thread_queues_a_span, .timeout = 300) {
    int kept = 0;
    for (uint64_t s = 0; s < SEEDS; s++)
        kept += fork_inside_a_remote_free(s);
    cr_assert_eq(kept, 0,
                 "%d of %d fork children never released a span a remote free had queued on no "
                 "list",
                 kept, SEEDS);
}
