/* The heap limit (heap_limit_mb) and the remote frees sent to the
 * allocating thread: a large or huge allocation over the limit was refused
 * while the thread's own inbox held frees that would have given back the
 * room (spans that empty go back to the arena, whose dirty slices a new
 * span takes without growing). A small allocation's refill applies the
 * inbox first; the large and huge ones did not. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/resident.h"
#include "src/reuse.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>

#define MiB ((size_t)1 << 20)
#define SIZE 4096
#define N (8 * MiB / SIZE)

static void *owned[N];

static void *free_all(void *arg) {
    (void)arg;
    for (unsigned i = 0; i < N; i++)
        lull_free(owned[i]);
    return NULL;
}

Test(limit_inbox, a_large_allocation_over_the_limit_applies_the_frees_sent_to_it_first) {
    cr_assert(lull_configure("warm_reserve_mb", "0"));
    lull_set_purge_delay_ms(0);
    lull_free(lull_malloc(64));
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    for (unsigned i = 0; i < N; i++)
        cr_assert_not_null(owned[i] = lull_malloc(SIZE));
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, free_all, NULL), 0);
    pthread_join(t, NULL);      /* its exit sent the last message: all in this heap's inbox */
    for (int i = 0; i < 3; i++) /* nothing dirty left for a forced purge to give back */
        cr_assert(lull_reclaim_now());
    unsigned mb = (unsigned)(lull_resident_bytes() >> 20) + 1;
    char v[16];
    snprintf(v, sizeof v, "%u", mb);
    cr_assert(lull_configure("heap_limit_mb", v));
    errno = 0;
    void *p = lull_malloc(2 * MiB);
    int err = errno;
    cr_assert(lull_configure("heap_limit_mb", "0"));
    cr_assert_not_null(p,
                       "2 MiB refused (errno %d) under a limit of %u MiB, with 8 MiB freed to "
                       "this thread",
                       err, mb);
    lull_free(p);
}
