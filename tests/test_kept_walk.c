/* The walk of another heap's reuse list (kept_by_someone, src/alloc.c)
 * races that heap's pops: a block it is on may be handed out and written
 * by its new user as the walk reads the block's link. The link then
 * decodes to garbage, and one that lands in the block's segment but not on
 * a block start was followed: a link into the last 7 bytes of the newest
 * segment made the walk read past the segment's end, into unmapped memory
 * (SIGSEGV), and one not 8-aligned made it read a misaligned word. Here
 * the garbage is written after the free (as the new user would write it),
 * and the walk is started by a double free of the block behind it. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/span.h"
#include "base/types.h"

#include "tests/support/fork_capture.h"
#include "tests/support/page_mapped.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void *g_x, *g_z;
static pthread_barrier_t phase;

/* The keeper: a heap of its own, then z and x freed, kept on its reuse
 * list of their class (x first, then z, whose link is NULL). It stays
 * until the child ran: its exit would send them home. */
static void *keep_both(void *unused) {
    (void)unused;
    lull_free(lull_malloc(32));
    lull_free(g_z);
    lull_free(g_x);
    pthread_barrier_wait(&phase);
    pthread_barrier_wait(&phase);
    return NULL;
}

/* In a child: x's link now leads 4 bytes before its segment's end, and the
 * owner frees z a second time (z looks free and names the keeper). */
static void garbage_link_then_double_free(void *unused) {
    (void)unused;
    uint8_t *end = (uint8_t *)lull_segment_of(g_x) + LULL_SEGMENT_SIZE;
    if (page_mapped(end)) _exit(77);
    lull_block *x = g_x;
    lull_block_set_next(x, (lull_block *)(end - 4));
    lull_free(g_z);
    lull_free(lull_malloc(16)); /* completes the deferred free of z */
}

Test(kept_walk, a_garbage_link_to_the_segments_last_bytes_is_not_followed) {
    g_x = lull_malloc(16);
    g_z = lull_malloc(16);
    cr_assert_eq(lull_segment_of(g_x), lull_segment_of(g_z));
    pthread_barrier_init(&phase, NULL, 2);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, keep_both, NULL), 0);
    pthread_barrier_wait(&phase);
    cr_assert(!lull_block_in_message(g_x) && lull_block_next(g_x) == g_z,
              "x and z were not kept on one list");
    child_result r;
    run_in_child(garbage_link_then_double_free, NULL, &r);
    pthread_barrier_wait(&phase);
    cr_assert_eq(pthread_join(t, NULL), 0);
    cr_assert(!(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 77), "the next segment is mapped");
    cr_assert(!WIFSIGNALED(r.status) || WTERMSIG(r.status) == SIGABRT,
              "the walk of the keeper's list killed the child: signal %d; stderr: '%s'",
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : 0, r.err);
}
