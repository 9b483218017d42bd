/* Defrag of a block that sits in a heap profile window
 * (src/profile_window.c): counted in use in its span, never handed out.
 * profile_sample_kb=1048576: windows are long and nothing is sampled. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/profile.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

const char *lull_conf = "profile_sample_kb=1048576";

#define SIZE ((size_t)512)

static lull_span *span_of(const void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static void in_thread(void *(*fn)(void *), void *arg) {
    lull_reclaim_now();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

static void *query_window_block(void *arg) {
    (void)arg;
    unsigned c = lull_class_of(SIZE);
    void *first = lull_malloc(SIZE);
    cr_assert_not_null(first);
    lull_heap *h = lull_tl_heap;
    cr_assert_not_null(h->profile);
    void *w = h->profile->window[c].free;
    cr_assert_not_null(w, "the class has a window");
    lull_defrag_info info;
    const void *pw = w;
    errno = 0;
    int rc = lull_defrag_query(&pw, 1, &info);
    cr_expect_eq(rc, -1, "a block never handed out (in a window) is refused, got rc %d size %zu",
                 rc, info.block_size);
    cr_expect_eq(errno, EINVAL);
    return NULL;
}

Test(defrag_profile_window, a_window_block_is_not_a_live_block) {
    in_thread(query_window_block, NULL);
}

static int cmp_ptr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return (x > y) - (x < y);
}

/* A window's span stops being current (a free into a full span of the
 * class makes that one current: the window took the current span's whole
 * list); a defrag move of one of the window's blocks then "moves" it and
 * frees it into its span, where malloc finds it a second time. */
static void *move_window_block(void *arg) {
    (void)arg;
    unsigned c = lull_class_of(SIZE);
    unsigned cap = lull_classes[c].capacity;
    lull_heap *h = lull_tl_heap;
    size_t n = 4 * (size_t)cap;
    void **b =
        mmap(NULL, n * sizeof(void *), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    /* span A full, then S current with a window */
    for (unsigned i = 0; i <= cap; i++)
        b[i] = lull_malloc(SIZE);
    h = lull_tl_heap;
    lull_span *A = span_of(b[0]), *S = h->current[c];
    cr_assert_neq(A, S);
    void *w = h->profile->window[c].free;
    cr_assert_not_null(w);
    cr_assert_eq(span_of(w), S, "the window is cut from S");
    cr_assert_null(S->free, "the window took S's list");
    /* a free into full A: A becomes current */
    lull_free(b[1]);
    lull_free(b[2]); /* completes the deferred free of b[1] */
    b[1] = b[2] = NULL;
    cr_log_info("current is A: %d; S used %u of %u", h->current[c] == A, lull_span_used(S),
                S->capacity);
    errno = 0;
    void *q = lull_defrag_move(w);
    cr_log_info("move of window block %p gave %p (errno %d)", w, q, errno);
    /* now allocate the rest and look for a block handed out twice */
    size_t got = 0;
    void **all = mmap(NULL, 2 * n * sizeof(void *), PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i <= cap; i++)
        if (b[i]) all[got++] = b[i];
    if (q != w) all[got++] = q;
    for (size_t i = 0; i < n; i++)
        all[got++] = lull_malloc(SIZE);
    qsort(all, got, sizeof *all, cmp_ptr);
    for (size_t i = 1; i < got; i++)
        cr_assert_neq(all[i], all[i - 1], "block %p handed out twice", all[i]);
    cr_assert_eq(q, w, "a window block is not moved");
    return NULL;
}

Test(defrag_profile_window, a_window_block_is_not_moved) {
    in_thread(move_window_block, NULL);
}
