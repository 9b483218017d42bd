/* glibc's __libc_* names of the malloc family (__libc_malloc, __libc_free,
 * __libc_calloc, __libc_realloc, __libc_memalign, __libc_valloc,
 * __libc_pvalloc) are lull's in a program linked with liblull.a, as malloc
 * is: code written for glibc that calls them (an old malloc hook's
 * wrapper, a runtime or profiler) mixes them with malloc and free. When
 * they were glibc's, __libc_free(malloc(100)) handed a lull block to
 * glibc's free ("free(): invalid pointer", abort), and free(__libc_malloc(100))
 * a glibc block to lull's. tests/test_preload_programs.c runs the same
 * calls under LD_PRELOAD=liblull.so (tests/programs/libc_names.c), and
 * tests/test_glibc_calls_exported.c sees the names exported for plugins.
 * Only in LULL_OVERRIDE builds (glibc's names are glibc's otherwise). */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/fork_capture.h"
#include "tests/support/libc_names.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>

#ifdef LULL_OVERRIDE
#define SKIP_UNLESS_OVERRIDE() ((void)0)
#else
#define SKIP_UNLESS_OVERRIDE() cr_skip_test("LULL_OVERRIDE is off: glibc's names are glibc's")
#endif

/* Each name's block is lull's, freed by the same family: this never mixes
 * two allocators, whoever the names belong to. */
Test(glibc_libc_names, each_call_returns_a_block_of_lull) {
    SKIP_UNLESS_OVERRIDE();
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    struct {
        const char *call;
        void *p;
    } blocks[] = {
        {"__libc_malloc(100)", __libc_malloc(100)},
        {"__libc_calloc(10, 10)", __libc_calloc(10, 10)},
        {"__libc_realloc(NULL, 100)", __libc_realloc(NULL, 100)},
        {"__libc_memalign(256, 1000)", __libc_memalign(256, 1000)},
        {"__libc_valloc(100)", __libc_valloc(100)},
        {"__libc_pvalloc(100)", __libc_pvalloc(100)},
    };
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++) {
        cr_assert_not_null(blocks[i].p, "%s", blocks[i].call);
        cr_expect(lull_owns(blocks[i].p), "%s returned %p, not a block of lull", blocks[i].call,
                  blocks[i].p);
    }
    cr_expect_eq((uintptr_t)blocks[3].p % 256, 0);
    cr_expect_eq((uintptr_t)blocks[4].p % page, 0);
    cr_expect_eq((uintptr_t)blocks[5].p % page, 0);
    if (lull_owns(blocks[5].p)) /* lull's usable size of another's block aborts */
        cr_expect_geq(lull_usable_size(blocks[5].p), page, "pvalloc: a whole page");
    for (size_t i = 0; i < sizeof blocks / sizeof *blocks; i++)
        __libc_free(blocks[i].p);
}

static void mix(void *unused) {
    (void)unused;
    const char *wrong = libc_names_mix();
    if (wrong) {
        fprintf(stderr, "%s\n", wrong);
        _exit(1);
    }
}

/* The blocks cross between the two families (in a child: a block freed by
 * the allocator that did not make it aborts). */
Test(glibc_libc_names, blocks_cross_between_them_and_malloc) {
    SKIP_UNLESS_OVERRIDE();
    child_result r;
    run_in_child(mix, NULL, &r);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0,
              "the mixed calls %s %d; stderr: '%s'",
              WIFSIGNALED(r.status) ? "died of signal" : "exited",
              WIFSIGNALED(r.status) ? WTERMSIG(r.status) : WEXITSTATUS(r.status), r.err);
    cr_expect_eq(r.err_len, 0, "stderr: '%s'", r.err);
}
