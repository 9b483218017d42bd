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
#include "tests/support/reclaim_hold.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define HELD_MS 300

static atomic_int malloc_starting;

static size_t vm_bytes(void) {
    long size = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld", &size) != 1) size = 0;
        fclose(f);
    }
    return (size_t)size * (size_t)sysconf(_SC_PAGESIZE);
}

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
