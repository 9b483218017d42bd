/* lull_defrag_move of a pointer the caller's heap holds free: refused. */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/deferred_free.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"
#include "tests/support/sparse_spans.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

#define SIZE ((size_t)1664)

static void in_thread(void *(*fn)(void *), void *arg) {
    lull_reclaim_now();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

/* free(p) keeps p in the heap's deferred slot until the next free: a
 * defrag move of p right after must see that p is free (the query does:
 * it completes the deferred free first), not move it. */
static void *move_after_free(void *arg) {
    (void)arg;
    void *p = sparse_block(SIZE);
    cr_assert_not_null(p);
    lull_defrag_info info;
    const void *pp = p;
    cr_assert_eq(lull_defrag_query(&pp, 1, &info), 0);
    cr_assert_eq(info.moved_would_help, 1, "p's move would help");
    /* another live block of a, so that a stays in use */
    lull_free(p);
    errno = 0;
    void *q = lull_defrag_move(p); /* a freed pointer: EINVAL, p back */
    cr_assert_eq(q, p, "a freed block is not moved (got %p for %p)", q, p);
    cr_assert_eq(errno, EINVAL);
    return NULL;
}

Test(defrag_after_free, a_move_right_after_free_is_refused) {
    in_thread(move_after_free, NULL);
}
