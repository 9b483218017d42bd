/* A double free of a block that waits in a heap profile window
 * (src/profile_window.c): free, cut into the window with the rest of its
 * span's list, counted in use, never handed out. Its free again looks free
 * (its first word is the window's link), and the owner's check walked the
 * span's lists but not the window: the block went onto its span's list
 * too, and malloc handed it out twice. profile_sample_kb=1048576: windows
 * are long and nothing is sampled. realloc of such a block kept it, the
 * same way. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/profile.h"
#include "src/size_class.h"
#include "tests/support/deferred_free.h"
#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

const char *lull_conf = "profile_sample_kb=1048576";

#define SIZE ((size_t)64)

static void free_a_window_block_again(void *w) {
    lull_free(w); /* free already: in the window */
    complete_last_free();
    /* had it gone through, both the window and the span's list hold w */
    for (int i = 0; i < 4096; i++) {
        if (lull_malloc(SIZE) == w && i > 0) {
            fprintf(stderr, "block %p handed out twice\n", w);
            _exit(3);
        }
    }
    _exit(2);
}

Test(free_profile_window, a_double_free_of_a_window_block_aborts) {
    /* a window of SIZE's class: the first malloc cuts it */
    void *first = lull_malloc(SIZE);
    cr_assert_not_null(first);
    cr_assert_not_null(lull_tl_heap->profile, "no heap profile");
    void *w = lull_tl_heap->profile->window[lull_class_of(SIZE)].free;
    cr_assert_not_null(w, "the class has no window");
    child_result r;
    run_in_child(free_a_window_block_again, w, &r);
    expect_abort(&r, w, "double free");
    lull_free(first);
}

static void realloc_a_window_block(void *w) {
    void *q = lull_realloc(w, SIZE / 2); /* kept: the window hands it out too */
    fprintf(stderr, "realloc returned %p\n", q);
    _exit(2);
}

/* realloc's check of its pointer: the same block, freed, not reallocated */
Test(free_profile_window, realloc_of_a_window_block_aborts) {
    void *first = lull_malloc(SIZE);
    cr_assert_not_null(first);
    void *w = lull_tl_heap->profile->window[lull_class_of(SIZE)].free;
    cr_assert_not_null(w, "the class has no window");
    child_result r;
    run_in_child(realloc_a_window_block, w, &r);
    expect_abort(&r, w, "was freed");
    lull_free(first);
}
