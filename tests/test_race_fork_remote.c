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
 * not by time.
 *
 * A thread without a heap (one past lull's heap destructor: a free in a
 * later thread-specific destructor) has no record to name the span: it
 * holds src/heap.c's heapless_lock from before the CAS to after the push,
 * and fork's prepare handler takes it, so the fork waits for the push.
 * The second test frees from such a destructor. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/span.h"

#include "tests/support/race_fork.h"

#include <criterion/criterion.h>
#include <pthread.h>
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
static int fork_inside_a_remote_free(uint64_t s, void *(*run)(void *)) {
    victim = block_of_a_full_span();
    int kept = race_fork_at(LULL_RACE_REMOTE_QUEUE, 0xf0de0ULL * (s + 1), run, blocks[victim],
                            child_check, span_of(blocks[victim]), NULL);
    for (int i = 0; i < BLOCKS; i++)
        if (i != victim) lull_free(blocks[i]);
    lull_thread_collect();
    return kept;
}

/* Every trial with `run` freeing the block: fails if a child kept a span. */
static void no_child_keeps_the_span(void *(*run)(void *), const char *free_kind) {
    int kept = 0;
    for (uint64_t s = 0; s < SEEDS; s++)
        kept += fork_inside_a_remote_free(s, run);
    cr_assert_eq(kept, 0, "%d of %d fork children never released a span a %s had queued on no list",
                 kept, SEEDS, free_kind);
}

Test(race_fork_remote, fork_while_another_thread_queues_a_span, .timeout = 300) {
    no_child_keeps_the_span(free_one, "remote free");
}

/* Created after lull's heap key (the first malloc creates that): glibc
 * runs a thread's destructors in key order, so this one runs after lull's
 * has abandoned the thread's heap, and its free is a heapless one. */
static pthread_key_t after_the_heap;

static void free_without_a_heap(void *p) {
    lull_free(p);
}

/* The thread makes a heap (its free then finds lull's destructor done),
 * and leaves p to be freed at its exit. */
static void *free_one_at_exit(void *p) {
    lull_free(lull_malloc(64));
    cr_assert_eq(pthread_setspecific(after_the_heap, p), 0);
    return NULL;
}

Test(race_fork_remote, fork_while_a_thread_without_a_heap_queues_a_span, .timeout = 300) {
    lull_free(lull_malloc(64)); /* lull's heap key first */
    cr_assert_eq(pthread_key_create(&after_the_heap, free_without_a_heap), 0);
    no_child_keeps_the_span(free_one_at_exit, "heapless remote free");
}
