/* The double-free checks of an 8-byte block at the very end of the newest
 * segment. They read a freed block's second word for the heap that keeps
 * it (kept_by_someone, src/alloc.c); an 8-byte block has one word, and
 * for that block the second is past the segment, in unmapped memory: a
 * double free died of SIGSEGV instead of aborting with a message, and
 * with strict_checks=on so did a valid remote free. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"

#include "tests/support/fork_capture.h"
#include "tests/support/page_mapped.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

static void *g_last, *g_other1, *g_other2;

/* 8-byte blocks until one is the last word of a segment whose next 32 MiB
 * boundary is not mapped (the newest segment). */
static void allocate_to_a_segments_end(void) {
    g_other1 = lull_malloc(8);
    g_other2 = lull_malloc(8);
    for (unsigned long n = 0; n < 20000000UL; n++) {
        void *p = lull_malloc(8);
        cr_assert_not_null(p);
        if (((uintptr_t)p & LULL_SEGMENT_MASK) == LULL_SEGMENT_SIZE - 8 &&
            !page_mapped((char *)p + 8)) {
            g_last = p;
            return;
        }
    }
    cr_assert_fail("no 8-byte block at the end of the newest segment");
}

/* The block at the end of the newest segment, then `child` run in a
 * forked child; the child exits 77 if the next segment's room got mapped
 * meanwhile (the block is then not at the end of mapped memory). */
static void run_at_segment_end(void (*child)(void *), child_result *r) {
    allocate_to_a_segments_end();
    run_in_child(child, NULL, r);
    cr_assert(!(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 77),
              "the next segment is mapped");
}

/* the owner: free(p), free(x), free(p), free(y): the second free of p is
 * checked (it looks free: last on its span's list) at the free of y */
static void owner_double_free(void *unused) {
    (void)unused;
    if (page_mapped((char *)g_last + 8)) _exit(77);
    lull_free(g_last);
    lull_free(g_other1);
    lull_free(g_last);
    lull_free(g_other2);
}

Test(segment_end, owner_double_free_of_the_last_8_byte_block_of_a_segment_aborts) {
    child_result r;
    run_at_segment_end(owner_double_free, &r);
    expect_abort(&r, g_last, "double free");
}

static void *run_then_exit(void *fn) {
    (*(void (**)(void))fn)();
    _exit(0);
}

/* `fn` on another thread of the child, which exits when fn returns. Not
 * joined: under ThreadSanitizer the parent's threads stay in its registry
 * after fork, a thread created here may get one of their pthread_t, and
 * the join makes TSan die ("dup thread with used id"; test_free_errors
 * does the same). */
static void on_another_thread(void (*fn)(void)) {
    static void (*run)(void);
    run = fn;
    pthread_t t;
    if (pthread_create(&t, NULL, run_then_exit, &run) != 0) _exit(5);
    for (;;)
        pause();
}

static void remote_frees(void) {
    lull_free(g_last);   /* onto the span's remote list (8-byte: no message) */
    lull_free(g_other1); /* ahead of it there */
    lull_free(g_last);   /* looks free: check_remote_double_free */
}

static void remote_double_free(void *unused) {
    (void)unused;
    if (page_mapped((char *)g_last + 8)) _exit(77);
    on_another_thread(remote_frees);
}

Test(segment_end, remote_double_free_of_the_last_8_byte_block_of_a_segment_aborts) {
    child_result r;
    run_at_segment_end(remote_double_free, &r);
    expect_abort(&r, g_last, "double free");
}

/* realloc() of a freed 8-byte block (lull_check_live_block) */
static void realloc_after_free(void *unused) {
    (void)unused;
    if (page_mapped((char *)g_last + 8)) _exit(77);
    lull_free(g_last);
    lull_free(g_other1); /* g_last linked: looks free */
    lull_realloc(g_last, 16);
}

Test(segment_end, realloc_of_the_freed_last_8_byte_block_of_a_segment_aborts) {
    child_result r;
    run_at_segment_end(realloc_after_free, &r);
    expect_abort(&r, g_last, "was freed");
}

/* strict_checks=on checks every remote free, live or not: a valid remote
 * free of that block must free it, not crash */
static void remote_free_once(void) {
    lull_free(g_last);
}

static void strict_remote_free(void *unused) {
    (void)unused;
    if (page_mapped((char *)g_last + 8)) _exit(77);
    if (!lull_configure("strict_checks", "on")) _exit(6);
    on_another_thread(remote_free_once);
}

Test(segment_end, strict_remote_free_of_the_last_8_byte_block_of_a_segment_frees_it) {
    child_result r;
    run_at_segment_end(strict_remote_free, &r);
    if (WIFSIGNALED(r.status))
        cr_assert_fail("a valid free killed the child: signal %d; stderr: '%s'", WTERMSIG(r.status),
                       r.err);
    cr_assert_eq(WEXITSTATUS(r.status), 0, "exit %d; stderr: '%s'", WEXITSTATUS(r.status), r.err);
}
