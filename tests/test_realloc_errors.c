/* realloc() of a pointer that is not a live block's start aborts naming
 * the pointer, as free() does, instead of keeping, growing or copying
 * memory that is not the caller's: a pointer inside a small, large or
 * huge block, and a block already freed. Each bad call runs in a forked
 * child (tests/support/fork_capture.h), which must die of SIGABRT with a
 * message that names realloc(), the address and the problem. */
#define _GNU_SOURCE
#include "lull.h"

#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void warm(void) {
    void *p = lull_malloc(16);
    cr_assert_not_null(p);
    lull_free(p);
}

/* the pointer and the size the child reallocs it to */
typedef struct {
    void *p;
    size_t size;
} realloc_call;

/* Exit status 5: realloc returned (the bad pointer was accepted). */
static void do_realloc(void *arg) {
    realloc_call *c = arg;
    void *q = lull_realloc(c->p, c->size);
    (void)q;
    _exit(5);
}

static void expect_realloc_abort(void *p, size_t size, const char *problem) {
    realloc_call c = {p, size};
    child_result r;
    run_in_child(do_realloc, &c, &r);
    cr_assert_not(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 5,
                  "realloc(%p, %zu) returned; stderr: '%s'", p, size, r.err);
    expect_abort(&r, p, problem);
    cr_assert_not_null(strstr(r.err, "realloc()"), "stderr: '%s'", r.err);
}

/* ---- pointers inside a block -------------------------------------------- */

/* A size that fits the block: realloc kept the pointer, and the caller
 * wrote past the block into its neighbour. */
Test(realloc_errors, interior_pointer_of_a_small_block_kept, .init = warm) {
    char *p = lull_malloc(40);
    cr_assert_not_null(p);
    expect_realloc_abort(p + 8, 48, "inside the 48-byte block");
    lull_free(p);
}

/* A larger size: the copy started inside the block. */
Test(realloc_errors, interior_pointer_of_a_small_block_moved, .init = warm) {
    char *p = lull_malloc(64);
    cr_assert_not_null(p);
    expect_realloc_abort(p + 16, 4 * KiB, "inside the 64-byte block");
    lull_free(p);
}

Test(realloc_errors, interior_pointer_of_a_large_block, .init = warm) {
    char *p = lull_malloc(2 * MiB);
    cr_assert_not_null(p);
    expect_realloc_abort(p + 4 * KiB, 2 * MiB - 8 * KiB, "inside a large block");
    lull_free(p);
}

/* A huge block grown in place from a pointer 4 KiB in: it was 4 KiB short
 * of the size asked for. */
Test(realloc_errors, interior_pointer_of_a_huge_block, .init = warm) {
    char *p = lull_malloc(40 * MiB);
    cr_assert_not_null(p);
    expect_realloc_abort(p + 4 * KiB, 80 * MiB, "inside a huge block");
    lull_free(p);
}

/* ---- blocks already freed ----------------------------------------------- */

/* free(p), then realloc(p): the mapping waits in the huge cache, and
 * realloc handed it out while the next malloc took it again. */
static void free_then_realloc(void *arg) {
    realloc_call *c = arg;
    lull_free(c->p);
    do_realloc(c);
}

static void expect_freed_realloc_abort(size_t size, const char *problem) {
    void *p = lull_malloc(size);
    cr_assert_not_null(p);
    realloc_call c = {p, size};
    child_result r;
    run_in_child(free_then_realloc, &c, &r);
    cr_assert_not(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 5,
                  "realloc of freed %p returned; stderr: '%s'", p, r.err);
    expect_abort(&r, p, problem);
    cr_assert_not_null(strstr(r.err, "realloc()"), "stderr: '%s'", r.err);
    lull_free(p);
}

Test(realloc_errors, freed_huge_block, .init = warm) {
    expect_freed_realloc_abort(100 * MiB, "freed");
}

Test(realloc_errors, freed_large_block, .init = warm) {
    expect_freed_realloc_abort(2 * MiB, "freed");
}

/* The thread's last free waits in its heap (the deferred free): realloc
 * must see it there. */
Test(realloc_errors, freed_small_block_waiting_as_the_deferred_free, .init = warm) {
    expect_freed_realloc_abort(200, "freed");
}

/* b freed, then c: b is linked on its span's list. */
static void *g_b, *g_c;

static void free_b_c_realloc_b(void *unused) {
    (void)unused;
    lull_free(g_b);
    lull_free(g_c);
    realloc_call c = {g_b, 200};
    do_realloc(&c);
}

Test(realloc_errors, freed_small_block_on_its_span_list, .init = warm) {
    g_b = lull_malloc(200);
    g_c = lull_malloc(200);
    cr_assert(g_b && g_c);
    child_result r;
    run_in_child(free_b_c_realloc_b, NULL, &r);
    cr_assert_not(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 5,
                  "realloc of freed %p returned; stderr: '%s'", g_b, r.err);
    expect_abort(&r, g_b, "freed");
    cr_assert_not_null(strstr(r.err, "realloc()"), "stderr: '%s'", r.err);
    lull_free(g_b);
    lull_free(g_c);
}

/* ---- what stays allowed ------------------------------------------------- */

/* Live blocks of every kind realloc as before, their bytes kept. */
Test(realloc_errors, live_blocks_of_every_kind_still_realloc, .init = warm) {
    static const size_t sizes[] = {24, 1000, 100 * KiB, 2 * MiB, 40 * MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        unsigned char *p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        memset(p, 0x5a, 16);
        unsigned char *q = lull_realloc(p, sizes[k] * 2);
        cr_assert_not_null(q);
        for (int i = 0; i < 16; i++)
            cr_assert_eq(q[i], 0x5a, "size %zu byte %d", sizes[k], i);
        q = lull_realloc(q, sizes[k]);
        cr_assert_not_null(q);
        cr_assert_eq(q[15], 0x5a);
        lull_free(q);
    }
}
