/* lull_defrag_query and lull_defrag_move of a block of the caller's own
 * heap that another thread freed onto its span's remote list (a thread
 * past lull's heap destructor frees there; so do frees of 8-byte blocks),
 * not collected yet: the caller's heap holds it free, so both refuse it
 * (EINVAL), as they refuse a block on the span's local list. The query
 * took it for live (its walk was of the local list only), and the move
 * died of a double free. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"
#include "tests/support/sparse_spans.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <sys/mman.h>

#define SIZE ((size_t)1664)

static pthread_key_t late_key;
static void *late_block;

/* runs after lull's key destructor (a key created later): the thread has
 * no heap any more, so its free goes onto the span's own remote list */
static void late_free(void *value) {
    (void)value;
    lull_free(late_block);
}

static void *late_thread(void *arg) {
    (void)arg;
    lull_free(lull_malloc(32)); /* a heap, which lull's destructor abandons */
    pthread_setspecific(late_key, (void *)1);
    return NULL;
}

static void *query_after_remote_free(void *arg) {
    (void)arg;
    void *p = sparse_block(SIZE);
    cr_assert_not_null(p);
    const void *pp = p;
    lull_defrag_info info;
    cr_assert_eq(lull_defrag_query(&pp, 1, &info), 0);
    cr_assert_eq(info.moved_would_help, 1, "p's move would help");
    late_block = p;
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, late_thread, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
    lull_span *span = lull_span_of(lull_segment_of(p), p);
    cr_assert_eq(lull_remote_head(atomic_load(&span->thread_free)), p,
                 "p is not first on its span's remote list");
    /* nothing allocated from here on: an allocation would collect p */
    errno = 0;
    int rc = lull_defrag_query(&pp, 1, &info);
    cr_assert_eq(rc, -1, "a block on its span's remote list was taken for live (would help %d)",
                 info.moved_would_help);
    cr_assert_eq(errno, EINVAL);
    errno = 0;
    cr_assert_eq(lull_defrag_move(p), p);
    cr_assert_eq(errno, EINVAL);
    return NULL;
}

Test(defrag_remote_free, a_block_on_its_spans_remote_list_is_refused) {
    /* lull first: its key destructor must come before late_key's, and a
     * build that does not replace malloc (the sanitizer builds) creates
     * its key at its first allocation */
    lull_free(lull_malloc(32));
    lull_reclaim_now();
    cr_assert_eq(pthread_key_create(&late_key, late_free), 0);
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, query_after_remote_free, NULL), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}
