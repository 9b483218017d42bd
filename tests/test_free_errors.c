/* Invalid and double frees end in a clear abort: each bad operation runs in a
 * forked child whose stderr goes to a pipe; the child must die of SIGABRT
 * and its message must say "lull", print the address as %p does, and name
 * the problem. Also the configuration errors (base/config.c): a bad value or
 * an unknown key is reported once, naming the key, and the default is kept,
 * from lull_configure() and from LULL_CONF in a new process. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "base/fault.h"
#include "src/heap.h"
#include "src/span.h"
#include "base/types.h"

#include "tests/support/deferred_free.h"
#include "tests/support/fork_capture.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

/* ---- running a bad operation in a child --------------------------------- */

static unsigned count_lines_starting(const char *text, const char *prefix) {
    unsigned n = 0;
    size_t pl = strlen(prefix);
    for (const char *line = text; line && *line;) {
        if (strncmp(line, prefix, pl) == 0) n++;
        line = strchr(line, '\n');
        if (line) line++;
    }
    return n;
}

/* Make sure the process has a heap and a segment before forking. */
static void warm(void) {
    void *p = lull_malloc(16);
    cr_assert_not_null(p);
    lull_free(p);
}

/* ---- invalid pointers --------------------------------------------------- */

static void do_free(void *p) {
    lull_free(p);
}

Test(free_errors, free_of_a_stack_address, .init = warm) {
    long on_stack[4] = {0};
    child_result r;
    run_in_child(do_free, &on_stack[1], &r);
    expect_abort(&r, &on_stack[1], "not allocated by lull");
    cr_assert_not_null(strstr(r.err, "invalid pointer"));
}

static char a_global[64];

Test(free_errors, free_of_a_global_address, .init = warm) {
    child_result r;
    run_in_child(do_free, &a_global[8], &r);
    expect_abort(&r, &a_global[8], "invalid pointer");
}

/* The segment map covers the 47-bit user address space; a pointer above it
 * (a kernel address, a corrupted one) is reported, not looked up. */
Test(free_errors, free_of_an_address_above_the_user_address_space, .init = warm) {
    void *const addresses[] = {(void *)0xffff888000001000u, (void *)((uintptr_t)1 << 47),
                               (void *)0x8000000000000040u};
    for (size_t k = 0; k < sizeof addresses / sizeof addresses[0]; k++) {
        child_result r;
        run_in_child(do_free, addresses[k], &r);
        expect_abort(&r, addresses[k], "not allocated by lull");
    }
}

static void do_free_sized_64(void *p) {
    lull_free_sized(p, 64);
}

/* A sized free of a foreign pointer is reported as free()'s is (the
 * sized path has its own way out of the segment map check), and one of
 * NULL does nothing. */
Test(free_errors, sized_free_of_a_foreign_pointer, .init = warm) {
    child_result r;
    run_in_child(do_free_sized_64, &a_global[16], &r);
    expect_abort(&r, &a_global[16], "invalid pointer");
    /* the call is named: it said malloc_usable_size() (session 22) */
    cr_assert_not_null(strstr(r.err, "free_sized()"), "stderr: '%s'", r.err);
    lull_free_sized(NULL, 64);
    lull_free(NULL);
}

static void do_usable(void *p) {
    (void)lull_usable_size(p);
}

Test(free_errors, usable_size_of_a_foreign_pointer, .init = warm) {
    child_result r;
    run_in_child(do_usable, &a_global[0], &r);
    expect_abort(&r, &a_global[0], "invalid pointer");
    cr_assert_not_null(strstr(r.err, "usable_size"), "stderr: '%s'", r.err);
}

Test(free_errors, free_of_an_interior_pointer_of_a_large_block, .init = warm) {
    static const size_t offsets[] = {8, 4096, 70000, MiB + 16};
    char *p = lull_malloc(2 * MiB);
    cr_assert_not_null(p);
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        child_result r;
        run_in_child(do_free, p + offsets[k], &r);
        expect_abort(&r, p + offsets[k], "inside a large block");
    }
    lull_free(p); /* the parent's block is still fine */
}

Test(free_errors, free_of_an_interior_pointer_of_a_huge_block, .init = warm) {
    static const size_t offsets[] = {16, 4096, MiB, 10 * MiB + 8, 30 * MiB};
    char *p = lull_malloc(40 * MiB);
    cr_assert_not_null(p);
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        child_result r;
        run_in_child(do_free, p + offsets[k], &r);
        if (strstr(r.err, "not allocated by lull"))
            /* beyond the header's 32 MiB: reported as foreign, also right */
            expect_abort(&r, p + offsets[k], "invalid pointer");
        else
            expect_abort(&r, p + offsets[k], "inside a huge block");
    }
    lull_free(p);
}

/* The block of a huge mapping is user data; free() of an interior pointer
 * must not take that data for span descriptors. Here the data happens to
 * look like a small span of the freeing thread's own heap at the place where
 * the segment layout keeps the descriptor of the pointer's slice. */
static void free_interior_of_crafted_huge(void *arg) {
    char *p = arg;
    char *q = p + 4 * MiB;
    lull_segment *seg = lull_segment_of(q);
    unsigned slice = (unsigned)(((uintptr_t)q & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT);
    /* where free() would look: the slice's entry in the span_head table,
     * then the descriptor it names; craft whichever lies in the user data */
    uint16_t *entry = &lull_span_table_of(seg)->span_head[slice];
    if ((char *)entry >= p && (char *)(entry + 1) <= p + 8 * MiB)
        *entry = (uint16_t)(slice * sizeof(lull_span));
    lull_span *d = lull_span_of(seg, q);
    if ((char *)d >= p && (char *)(d + 1) <= p + 8 * MiB) {
        memset(d, 0, sizeof *d);
        d->kind = LULL_SPAN_SMALL;
        d->block_size = 64;
        d->capacity = 100;
        d->used = 50;
        atomic_store(&d->heap, lull_tl_heap); /* user data that happens to hold this value */
    }
    lull_free(q);
}

Test(free_errors, free_of_an_interior_pointer_of_a_huge_block_whose_data_looks_like_a_span,
     .init = warm) {
    char *p = lull_calloc(1, 20 * MiB);
    cr_assert_not_null(p);
    child_result r;
    run_in_child(free_interior_of_crafted_huge, p, &r);
    expect_abort(&r, p + 4 * MiB, "inside a huge block");
    lull_free(p);
}

/* An address in a slice no span uses (the segment's free slices) and one in
 * the segment's metadata slice. */
Test(free_errors, free_of_a_pointer_into_free_slices, .init = warm) {
    char *p = lull_malloc(64);
    cr_assert_not_null(p);
    lull_segment *seg = lull_segment_of(p);
    cr_assert_eq(seg->magic, LULL_SEGMENT_MAGIC);
    /* find a slice that is free (clean or dirty) */
    int free_slice = -1;
    for (unsigned i = LULL_SLICES - 1; i > LULL_META_SLICES; i--) {
        uint64_t bit = (uint64_t)1 << (i % 64);
        if ((atomic_load(&lull_slice_maps_of(seg)->clean[i / 64]) |
             atomic_load(&lull_slice_maps_of(seg)->dirty[i / 64])) &
            bit) {
            free_slice = (int)i;
            break;
        }
    }
    cr_assert_geq(free_slice, 0, "no free slice in a fresh segment");
    char *in_free = (char *)lull_slice_address(seg, (unsigned)free_slice) + 128;
    child_result r;
    run_in_child(do_free, in_free, &r);
    expect_abort(&r, in_free, "no block there");

    char *in_meta = (char *)seg + 256;
    run_in_child(do_free, in_meta, &r);
    expect_abort(&r, in_meta, "invalid pointer");
    lull_free(p);
}

/* A large block freed: its slices are free, a second free finds no block. */
Test(free_errors, free_of_a_pointer_into_a_freed_large_block, .init = warm) {
    char *p = lull_malloc(3 * MiB);
    cr_assert_not_null(p);
    lull_free(p);
    child_result r;
    run_in_child(do_free, p + MiB, &r);
    expect_abort(&r, p + MiB, "invalid pointer");
}

/* ---- double frees ------------------------------------------------------- */

static void do_double_free(void *p) {
    lull_free(p);
    lull_free(p);
}

static void double_free_small_of(size_t size) {
    void *p = lull_malloc(size);
    cr_assert_not_null(p);
    child_result r;
    run_in_child(do_double_free, p, &r);
    expect_abort(&r, p, "double free");
    lull_free(p);
}

Test(free_errors, double_free_of_a_small_block, .init = warm) {
    double_free_small_of(64);
}

static void *g_b, *g_c;

/* A double free that is not a repeat of the thread's last free waits with
 * that free (the deferred free, src/alloc.h): the thread's next free of
 * another block (complete_last_free) checks it, or a malloc that reaches
 * the block (below). */

static void free_b_c_b(void *unused) {
    (void)unused;
    lull_free(g_b);
    lull_free(g_c);
    lull_free(g_b);
    complete_last_free();
}

/* Blocks a, b and c of one class, a freed: the child frees b twice (its
 * way), and must abort naming b. */
static void expect_b_freed_twice(void (*child)(void *), void *arg) {
    void *a = lull_malloc(200);
    g_b = lull_malloc(200);
    g_c = lull_malloc(200);
    cr_assert(a && g_b && g_c);
    lull_free(a);
    child_result r;
    run_in_child(child, arg, &r);
    expect_abort(&r, g_b, "double free");
    lull_free(g_b);
    lull_free(g_c);
}

Test(free_errors, double_free_of_a_small_block_between_other_frees, .init = warm) {
    expect_b_freed_twice(free_b_c_b, NULL);
}

/* free(b), free(c), free(b): b is on its span's list, and waits again as
 * the deferred free; the malloc that reaches it (after c) must abort, not
 * hand it out while the deferred free would link it once more */
static void free_b_c_b_then_malloc_twice(void *use_calloc) {
    lull_free(g_b);
    lull_free(g_c);
    lull_free(g_b);
    for (int i = 0; i < 2; i++) {
        void *p = use_calloc ? lull_calloc(1, 200) : lull_malloc(200);
        if (p == g_b) _exit(7); /* handed out: the deferred free links it again */
    }
}

Test(free_errors, double_free_waiting_as_the_deferred_free_is_seen_by_malloc, .init = warm) {
    expect_b_freed_twice(free_b_c_b_then_malloc_twice, NULL);
}

Test(free_errors, double_free_waiting_as_the_deferred_free_is_seen_by_calloc, .init = warm) {
    expect_b_freed_twice(free_b_c_b_then_malloc_twice, &g_b); /* any non-NULL: calloc */
}

/* The first free of the only handed-out block of a span leaves a free list
 * of one block whose link is NULL: the second free must still be caught. */
Test(free_errors, double_free_of_the_only_block_of_a_span, .init = warm) {
    double_free_small_of(8 * KiB);
}

Test(free_errors, double_free_of_a_128KiB_block, .init = warm) {
    double_free_small_of(128 * KiB);
}

Test(free_errors, double_free_of_a_large_block, .init = warm) {
    void *p = lull_malloc(MiB);
    cr_assert_not_null(p);
    child_result r;
    run_in_child(do_double_free, p, &r);
    expect_abort(&r, p, "double free");
    lull_free(p);
}

/* Without a reclaim thread the freed huge block stays mapped and queued:
 * the second free sees its freed flag. */
Test(free_errors, double_free_of_a_huge_block_still_queued, .init = warm) {
    void *p = lull_malloc(20 * MiB);
    cr_assert_not_null(p);
    lull_fault_arm(LULL_FAULT_THREAD_CREATE, 1); /* the child's reclaim thread fails to start */
    child_result r;
    run_in_child(do_double_free, p, &r);
    lull_fault_arm(LULL_FAULT_THREAD_CREATE, 0);
    expect_abort(&r, p, "double free");
    cr_assert_not_null(strstr(r.err, "huge"), "stderr: '%s'", r.err);
    lull_free(p);
}

/* Free a huge block, let the reclaim thread take it (two ticks), free it
 * again. Exit status 3: there is no reclaim thread. */
static void free_reclaim_free(void *p) {
    lull_free(p);
    if (!lull_reclaim_now()) _exit(3);
    lull_reclaim_now();
    lull_free(p);
}

/* With the reclaim thread and no cache: once it unmapped the block, the
 * second free finds no lull memory there. */
static void double_free_huge_after_reclaim(void *p) {
    if (!lull_configure("huge_cache_mb", "0")) _exit(4);
    free_reclaim_free(p);
}

/* Runs `child` on a fresh 20 MiB block and expects it to abort naming the
 * block and `problem`. */
static void expect_huge_double_free(void (*child)(void *), const char *problem, child_result *r) {
    void *p = lull_malloc(20 * MiB);
    cr_assert_not_null(p);
    run_in_child(child, p, r);
    cr_assert_not(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 3, "no reclaim thread");
    expect_abort(r, p, problem);
    lull_free(p);
}

Test(free_errors, double_free_of_a_huge_block_already_unmapped, .init = warm) {
    child_result r;
    expect_huge_double_free(double_free_huge_after_reclaim, "invalid pointer", &r);
}

/* With the cache: the freed mapping stays mapped (purged) for reuse, and the
 * second free sees its freed flag. */
Test(free_errors, double_free_of_a_cached_huge_block, .init = warm) {
    child_result r;
    expect_huge_double_free(free_reclaim_free, "double free", &r);
    cr_assert_not_null(strstr(r.err, "huge"), "stderr: '%s'", r.err);
}

/* ---- sized frees -------------------------------------------------------- */

static void free_sized_50(void *p) {
    lull_free_sized(p, 50);
}
static void free_sized_300(void *p) {
    lull_free_sized(p, 300);
}
static void free_sized_too_big(void *p) {
    lull_free_sized(p, 3 * MiB);
}

Test(free_errors, free_sized_with_a_wrong_size, .init = warm) {
    void *p = lull_malloc(100); /* a 112-byte block */
    cr_assert_not_null(p);
    child_result r;
    run_in_child(free_sized_50, p, &r);
    expect_abort(&r, p, "does not match");
    run_in_child(free_sized_300, p, &r);
    expect_abort(&r, p, "larger than block");
    lull_free_sized(p, 100);

    void *large = lull_malloc(2 * MiB);
    cr_assert_not_null(large);
    run_in_child(free_sized_too_big, large, &r);
    expect_abort(&r, large, "larger than block");
    lull_free_sized(large, 2 * MiB);
}

/* ---- interior pointers of small blocks ----------------------------------- */

static void *remote_free_thread(void *p) {
    lull_free(p);
    _exit(0); /* the free returned: the child exits 0, as run_child's would */
}

/* The child does not join the thread: under ThreadSanitizer (gcc 12's
 * libtsan), the threads the parent had at fork stay in TSan's registry, a
 * thread created here may get the pthread_t (the cached stack) of one of
 * them, and pthread_join then makes TSan die ("dup thread with used id"). */
static void remote_interior(void *p) {
    pthread_t t;
    if (pthread_create(&t, NULL, remote_free_thread, p) != 0) _exit(5);
    for (;;)
        pause();
}

/* free(p + 16) of a 100-byte block (class 112) used to be accepted, and a
 * later malloc returned a block overlapping the live one: the default build
 * aborts now, on the owner thread and on any other. */
static void expect_interior_abort(void (*fn)(void *)) {
    static const size_t offsets[] = {16, 8, 64, 111};
    char *p = lull_malloc(100);
    cr_assert_not_null(p);
    for (size_t k = 0; k < sizeof offsets / sizeof offsets[0]; k++) {
        child_result r;
        run_in_child(fn, p + offsets[k], &r);
        expect_abort(&r, p + offsets[k], "invalid pointer");
        cr_assert_not_null(strstr(r.err, "112-byte block"), "stderr: '%s'", r.err);
        char block[32];
        snprintf(block, sizeof block, "%p", (void *)p);
        cr_assert_not_null(strstr(r.err, block), "the block %s not named: '%s'", block, r.err);
    }
    lull_free(p);
}

Test(free_errors, free_of_an_interior_pointer_of_a_small_block, .init = warm) {
    expect_interior_abort(do_free);
}

Test(free_errors, remote_free_of_an_interior_pointer_of_a_small_block, .init = warm) {
    expect_interior_abort(remote_interior);
}

/* ---- double frees from other threads -------------------------------------- */

static void *g_remote[3]; /* what the thread frees, in order */
static int g_remote_frees;
static _Atomic int g_remote_done;

static void *remote_double_free_thread(void *unused) {
    (void)unused;
    for (int i = 0; i < g_remote_frees; i++)
        lull_free(g_remote[i]);
    atomic_store(&g_remote_done, 1);
    return NULL;
}

/* In the child: a thread that frees, and the wait for its frees. Not
 * joined: see strict_remote_interior. */
static void start_freeing_thread(void *(*fn)(void *)) {
    pthread_t t;
    if (pthread_create(&t, NULL, fn, NULL) != 0) _exit(5);
    while (!atomic_load(&g_remote_done))
        sched_yield();
}

/* The thread frees; the owner then collects its remote frees. */
static void remote_double_free(void *unused) {
    (void)unused;
    start_freeing_thread(remote_double_free_thread);
    lull_thread_collect();
}

/* A child whose other thread frees order[0..n-1] must abort naming
 * order[0] as freed twice from other threads. */
static void expect_remote_double_free(void *const *order, int n) {
    cr_assert_leq(n, (int)(sizeof g_remote / sizeof g_remote[0]));
    memcpy(g_remote, order, (size_t)n * sizeof *order);
    g_remote_frees = n;
    child_result r;
    run_in_child(remote_double_free, NULL, &r);
    expect_abort(&r, order[0], "double free");
    cr_assert_not_null(strstr(r.err, "other threads"), "stderr: '%s'", r.err);
}

/* free(a) twice in a row from another thread: the block is still first on
 * its span's remote list at the second free */
Test(free_errors, double_free_in_a_row_from_another_thread, .init = warm) {
    void *a = lull_malloc(100);
    expect_remote_double_free((void *[]){a, a}, 2);
    lull_free(a);
}

/* free(a), free(b), free(a) from another thread: the remote list became a
 * cycle, which the owner's collection must report instead of walking
 * forever */
Test(free_errors, double_free_between_other_frees_from_another_thread, .init = warm) {
    void *a = lull_malloc(100), *b = lull_malloc(100);
    expect_remote_double_free((void *[]){a, b, a}, 3);
    lull_free(a);
    lull_free(b);
}

/* Another thread frees a (it keeps it on its reuse list, src/reuse.h: marked
 * as in a message), then the owner frees it: the owner's free sees the mark */
static void *g_kept;

static void *free_g_kept(void *unused) {
    (void)unused;
    lull_free(g_kept);
    atomic_store(&g_remote_done, 1);
    for (;;)
        pause(); /* holds its reuse list: never collects, never exits */
    return NULL;
}

static void owner_frees_after_another_thread(void *unused) {
    (void)unused;
    start_freeing_thread(free_g_kept);
    lull_free(g_kept);
    complete_last_free();
}

Test(free_errors, double_free_by_the_owner_of_a_block_another_thread_keeps, .init = warm) {
    g_kept = lull_malloc(100);
    child_result r;
    run_in_child(owner_frees_after_another_thread, NULL, &r);
    expect_abort(&r, g_kept, "double free");
    cr_assert_not_null(strstr(r.err, "then by its owner"), "stderr: '%s'", r.err);
    lull_free(g_kept);
}

/* ---- double frees of blocks on a reuse list (src/reuse.h) ------------------
 * A thread with a heap keeps the other heap's blocks it frees on its reuse
 * list, linked as a span's free list; the second free of such a block, by
 * the keeper, the owner or a third thread, must abort naming it. */

static void *keep_g_kept_and_hold(void *unused) {
    (void)unused;
    lull_free(lull_malloc(8)); /* a heap of its own: the free is kept */
    lull_free(g_kept);
    atomic_store(&g_remote_done, 1);
    for (;;)
        pause(); /* holds its reuse list */
    return NULL;
}

static void *keep_g_kept_and_free_again(void *unused) {
    (void)unused;
    lull_free(lull_malloc(8));
    lull_free(g_kept);
    lull_free(g_kept);
    atomic_store(&g_remote_done, 1);
    return NULL;
}

static void keeper_frees_twice(void *unused) {
    (void)unused;
    start_freeing_thread(keep_g_kept_and_free_again);
}

static void owner_frees_a_kept_block(void *unused) {
    (void)unused;
    start_freeing_thread(keep_g_kept_and_hold);
    lull_free(g_kept);
    complete_last_free();
}

static void *free_g_kept_once(void *unused) {
    (void)unused;
    lull_free(g_kept);
    return NULL;
}

static void third_thread_frees_a_kept_block(void *unused) {
    (void)unused;
    start_freeing_thread(keep_g_kept_and_hold);
    pthread_t t;
    if (pthread_create(&t, NULL, free_g_kept_once, NULL) != 0) _exit(5);
    pthread_join(t, NULL);
}

static void expect_kept_double_free(void (*child)(void *), const char *problem) {
    g_kept = lull_malloc(100);
    lull_free(lull_malloc(100)); /* not the only block of its span */
    child_result r;
    run_in_child(child, NULL, &r);
    expect_abort(&r, g_kept, "double free");
    cr_assert_not_null(strstr(r.err, problem), "stderr: '%s'", r.err);
    lull_free(g_kept);
}

Test(free_errors, double_free_of_a_kept_block_by_its_keeper, .init = warm) {
    expect_kept_double_free(keeper_frees_twice, "other threads");
}

Test(free_errors, double_free_of_a_kept_block_by_its_owner, .init = warm) {
    expect_kept_double_free(owner_frees_a_kept_block, "then by its owner");
}

Test(free_errors, double_free_of_a_kept_block_by_a_third_thread, .init = warm) {
    expect_kept_double_free(third_thread_frees_a_kept_block, "other threads");
}

/* A block of another segment than its class's list is kept on the second
 * list (marked as in a message): freed again by its keeper, it aborts. */
#define BIG_BLOCK 16384
#define BIG_MAX 4096 /* 64 MiB: two segments' worth at the most */
static void *g_first_segment;

static void *keep_two_segments_and_free_again(void *unused) {
    (void)unused;
    lull_free(lull_malloc(8));
    lull_free(g_first_segment);
    lull_free(g_kept); /* the other segment's: the second list */
    lull_free(g_kept);
    atomic_store(&g_remote_done, 1);
    return NULL;
}

static void keeper_frees_a_second_list_block_twice(void *unused) {
    (void)unused;
    start_freeing_thread(keep_two_segments_and_free_again);
}

Test(free_errors, double_free_of_a_block_on_the_second_reuse_list, .init = warm) {
    static void *big[BIG_MAX];
    unsigned n = 0;
    g_kept = NULL;
    while (n < BIG_MAX && !g_kept) {
        big[n] = lull_malloc(BIG_BLOCK);
        cr_assert_not_null(big[n]);
        if (lull_segment_of(big[n]) != lull_segment_of(big[0])) g_kept = big[n];
        n++;
    }
    cr_assert_not_null(g_kept, "no second segment after %u blocks", n);
    g_first_segment = big[0];
    child_result r;
    run_in_child(keeper_frees_a_second_list_block_twice, NULL, &r);
    expect_abort(&r, g_kept, "double free");
    cr_assert_not_null(strstr(r.err, "other threads"), "stderr: '%s'", r.err);
    for (unsigned i = 0; i < n; i++)
        lull_free(big[i]);
}

/* A kept block that malloc's fast path handed out again keeps its keeper's
 * name in its second word. A live block whose first word its user set to
 * what looks like a free-list link (so that its free takes the checked
 * path) must still be freed, not reported: the check finds it on no list. */
static void *g_reused;

static void *keep_pop_and_free(void *arg) {
    void **blocks = arg;
    lull_free(lull_malloc(8));
    for (unsigned i = 0; i < 8; i++)
        lull_free(blocks[i]);        /* kept: direct[] leads to the list */
    uintptr_t *b = lull_malloc(100); /* popped by the fast path: the last kept */
    g_reused = b;
    b[0] = (uintptr_t)b ^ lull_link_key(b); /* decodes to b: looks free */
    lull_free(b);
    lull_thread_collect(); /* the rest go home too */
    return NULL;
}

Test(free_errors, a_reused_block_that_looks_free_is_freed_not_reported, .init = warm) {
    void *blocks[8];
    for (unsigned i = 0; i < 8; i++)
        blocks[i] = lull_malloc(100);
    lull_span *span = lull_span_of(lull_segment_of(blocks[0]), blocks[0]);
    for (unsigned i = 1; i < 8; i++)
        cr_assert_eq(lull_span_of(lull_segment_of(blocks[i]), blocks[i]), span);
    uint32_t used = lull_span_used(span);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, keep_pop_and_free, blocks), 0);
    pthread_join(t, NULL);
    cr_assert_eq(g_reused, blocks[7], "not the last kept block");
    lull_thread_collect(); /* the owner applies what came home */
    cr_assert_eq(lull_span_used(span), used - 8, "every block came home once");
}

/* ---- configuration errors ----------------------------------------------- */

/* Run fn with stderr going to a pipe in this process; return the text. */
static void capture_stderr(bool (*fn)(const char *, const char *), const char *k, const char *v,
                           bool *ret, char *out, size_t cap) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    int saved = dup(STDERR_FILENO);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    *ret = fn(k, v);
    dup2(saved, STDERR_FILENO);
    close(saved);
    size_t len;
    read_all_fd(fds[0], out, cap, &len);
    close(fds[0]);
}

Test(free_errors, configure_bad_value_is_reported_once_and_the_value_kept) {
    lull_set_purge_delay_ms(777);
    char err[1024];
    bool ok;
    capture_stderr(lull_configure, "purge_delay_ms", "banana", &ok, err, sizeof err);
    cr_assert_not(ok);
    cr_assert_eq(count_lines_starting(err, "lull:"), 1, "stderr: '%s'", err);
    cr_assert_eq(count_lines_starting(err, ""), 1, "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "purge_delay_ms"), "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "banana"), "stderr: '%s'", err);
    cr_assert_eq(lull_purge_delay_ms(), 777);

    capture_stderr(lull_configure, "purge_delay_ms", "-3", &ok, err, sizeof err);
    cr_assert_not(ok);
    cr_assert_eq(count_lines_starting(err, "lull:"), 1, "stderr: '%s'", err);
    cr_assert_eq(lull_purge_delay_ms(), 777);

    /* a good value: true, silent, applied */
    capture_stderr(lull_configure, "purge_delay_ms", "250", &ok, err, sizeof err);
    cr_assert(ok);
    cr_assert_str_eq(err, "");
    cr_assert_eq(lull_purge_delay_ms(), 250);
}

Test(free_errors, configure_unknown_key_is_reported_once) {
    char err[1024];
    bool ok;
    capture_stderr(lull_configure, "purge_dealy_ms", "10", &ok, err, sizeof err);
    cr_assert_not(ok);
    cr_assert_eq(count_lines_starting(err, "lull:"), 1, "stderr: '%s'", err);
    cr_assert_eq(count_lines_starting(err, ""), 1, "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "purge_dealy_ms"), "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "unknown"), "stderr: '%s'", err);
    capture_stderr(lull_configure, "", "10", &ok, err, sizeof err);
    cr_assert_not(ok);
    capture_stderr(lull_configure, "verbose", "", &ok, err, sizeof err);
    cr_assert_not(ok);
    cr_assert_not_null(strstr(err, "verbose"), "stderr: '%s'", err);
}

/* LULL_CONF is read once at start: a new process of this very program, with
 * LULL_TEST_CONF_PROBE set, prints its purge delay from a constructor and
 * exits before Criterion starts. */
__attribute__((constructor(200))) static void conf_probe(void) {
    if (!getenv("LULL_TEST_CONF_PROBE")) return;
    void *p = lull_malloc(16); /* lull is initialised (and LULL_CONF read) */
    lull_free(p);
    char buf[64];
    int n = snprintf(buf, sizeof buf, "delay=%ld\n", lull_purge_delay_ms());
    ssize_t w = write(STDOUT_FILENO, buf, (size_t)n);
    (void)w;
    _exit(0);
}

/* The probe's output, its stderr in err; it must have exited 0. */
static const char *run_probe(const char *conf_var, const char *conf, child_run *cr) {
    char var[256];
    snprintf(var, sizeof var, "%s=%s", conf_var, conf);
    const char *vars[] = {var, "LULL_TEST_CONF_PROBE=1", NULL};
    reexec_run("probe", vars, var, 30000, cr);
    reexec_assert_exited_0(cr, var);
    return cr->out;
}

Test(free_errors, lull_conf_bad_value_in_a_new_process) {
    child_run r;
    const char *out, *err = r.err;
    /* the probe works: a good value is applied silently */
    out = run_probe("LULL_CONF", "purge_delay_ms=1234", &r);
    cr_assert_str_eq(out, "delay=1234\n");
    cr_assert_eq(count_lines_starting(err, "lull:"), 0, "stderr: '%s'", err);

    out = run_probe("LULL_CONF", "purge_delay_ms=oops", &r);
    cr_assert_str_eq(out, "delay=-2\n", "the default (auto) was not kept: %s", out);
    cr_assert_eq(count_lines_starting(err, "lull:"), 1, "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "purge_delay_ms"), "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "oops"), "stderr: '%s'", err);

    /* a bad value does not stop the keys after it */
    out = run_probe("LULL_CONF", "purge_delay_ms=oops,nosuchkey=1,purge_delay_ms=55", &r);
    cr_assert_str_eq(out, "delay=55\n");
    cr_assert_eq(count_lines_starting(err, "lull:"), 2, "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "nosuchkey"), "stderr: '%s'", err);

    out = run_probe("LULL_PURGE_DELAY_MS", "soon", &r);
    cr_assert_str_eq(out, "delay=-2\n");
    cr_assert_eq(count_lines_starting(err, "lull:"), 1, "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "purge_delay_ms"), "stderr: '%s'", err);
    cr_assert_not_null(strstr(err, "LULL_PURGE_DELAY_MS"), "stderr: '%s'", err);
}
