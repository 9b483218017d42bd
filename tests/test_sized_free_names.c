/* A sized free of a freed large block aborts naming the sized free: its
 * check asked malloc_usable_size() for the size first, whose abort named
 * malloc_usable_size(), a call the program never made. */
#define _GNU_SOURCE
#include "lull.h"

#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <string.h>

#define MiB ((size_t)1 << 20)

static void free_sized_1mib(void *p) {
    lull_free_sized(p, 1 * MiB);
}

static void free_aligned_sized_1mib(void *p) {
    lull_free_aligned_sized(p, 64, 1 * MiB);
}

Test(sized_free_names, a_freed_large_block) {
    void *p = lull_malloc(1 * MiB);
    cr_assert_not_null(p);
    lull_free(p);
    child_result r;
    run_in_child(free_sized_1mib, p, &r);
    expect_abort(&r, p, "free_sized()");
    cr_assert_null(strstr(r.err, "malloc_usable_size"), "stderr: '%s'", r.err);
    run_in_child(free_aligned_sized_1mib, p, &r);
    expect_abort(&r, p, "free_aligned_sized()");
}
