/* A huge malloc that the kernel refuses (an address space limit) while the
 * reclaim thread's huge cache holds the room it needs waits until the
 * forced tick has given that room back, however long the tick takes: the
 * one alternative is NULL. Bounded by the heap limit's 100 ms, such a
 * malloc failed whenever the tick took longer (test_huge_cache's
 * a_new_mapping_under_the_address_space_limit_evicts_the_cache went red
 * once in an ASan CI run on a loaded machine). Here the reclaim thread is
 * held (tests/support/reclaim_hold.h) and let go 300 ms after the malloc
 * started: the wait must outlast that. */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/reclaim.h"
#include "tests/support/mem_check.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define HELD_MS 300

static atomic_int malloc_starting;

/* lets the reclaim thread go HELD_MS after the malloc started */
static void *releaser(void *arg) {
    (void)arg;
    while (!atomic_load(&malloc_starting))
        sleep_ms(1);
    sleep_ms(HELD_MS);
    return (void *)(intptr_t)reclaim_release();
}

Test(relief_address_space, a_refused_mapping_waits_until_the_cache_gives_its_room_back) {
    lull_set_purge_delay_ms(-1); /* the cache keeps the freed mapping */
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, releaser, NULL), 0); /* its stack before the limit */
    /* 300 MiB above the process before the 200 MiB block: a new 250 MiB
     * mapping fits only once the cache has unmapped the freed one */
    size_t vm = vm_bytes();
    char *big = lull_malloc(200 * MiB);
    cr_assert_not_null(big);
    big[0] = 1;
    lull_free(big); /* into the huge cache, which holds its address space */
    struct rlimit old, lim = {vm + 300 * MiB, vm + 300 * MiB};
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    atomic_store(&malloc_starting, 1);
    uint64_t start = now_ms();
    char *q = lull_malloc(250 * MiB);
    uint64_t waited = now_ms() - start;
    void *released;
    pthread_join(t, &released);
    setrlimit(RLIMIT_AS, &old);
    cr_assert(released, "the reclaim thread was not let go");
    cr_assert_not_null(q, "malloc(250 MiB) failed after %llu ms while 200 MiB were cached",
                       (unsigned long long)waited);
    q[250 * MiB - 1] = 1;
    lull_free(q);
}

static atomic_int malloc_done;

/* lets the reclaim thread go once the malloc waits for its forced tick
 * (limit_waits counts the wait before it starts), or once the malloc
 * has returned without waiting */
static void *release_on_wait(void *arg) {
    uint64_t waits0 = (uint64_t)(uintptr_t)arg;
    for (;;) {
        lull_reclaim_stats s;
        lull_reclaim_get_stats(&s);
        if (s.limit_waits > waits0 || atomic_load(&malloc_done)) break;
        sleep_ms(1);
    }
    return (void *)(intptr_t)reclaim_release();
}

/* The tail of a huge block shrunk in place by realloc is address space
 * the reclaim thread still holds, as a freed mapping's is: a mapping the
 * kernel refuses waits for the tick that unmaps it. Before, the refused
 * malloc saw nothing held (the cache and the queue empty) and failed at
 * once, where the copy that realloc made before the shrink in place
 * freed the old block into the cache and the malloc waited and succeeded. */
Test(relief_address_space, a_refused_mapping_waits_until_a_shrunk_blocks_tail_is_given_back) {
    lull_set_purge_delay_ms(-1);
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_purge_all(); /* nothing cached or queued: only the tail is held */
    lull_reclaim_stats s;
    lull_reclaim_get_stats(&s);
    pthread_t t; /* its stack before the limit */
    cr_assert_eq(pthread_create(&t, NULL, release_on_wait, (void *)(uintptr_t)s.limit_waits), 0);
    size_t vm = vm_bytes();
    char *big = lull_malloc(200 * MiB);
    cr_assert_not_null(big);
    big[0] = 1;
    /* held before the shrink: no tick gives the tail back on its own */
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    char *small = lull_realloc(big, MiB);
    cr_assert_eq(small, big, "the block moved: no tail to wait for");
    struct rlimit old, lim = {vm + 300 * MiB, vm + 300 * MiB};
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    char *q = lull_malloc(250 * MiB);
    atomic_store(&malloc_done, 1);
    void *released;
    pthread_join(t, &released);
    setrlimit(RLIMIT_AS, &old);
    cr_assert(released, "the reclaim thread was not let go");
    cr_assert_not_null(q, "malloc(250 MiB) failed while a 199 MiB tail waited to be unmapped");
    q[250 * MiB - 1] = 1;
    lull_free(q);
    lull_free(small);
}
