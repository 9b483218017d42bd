/* A free never creates the reclaim thread (reclaim/reclaim.h), a huge one
 * neither: glibc frees the dynamic TLS blocks of cached thread stacks
 * holding its stack cache's lock, which pthread_create takes. A library
 * loaded with dlopen whose thread-local array is larger than lull's largest
 * non-huge block (tests/big_tls/big_tls.c) gets a huge block of lull's in
 * each thread that touches it; a join past 40 MiB of cached stacks freed
 * one there, the free created the deferred reclaim thread, and
 * pthread_create waited for ever on the lock its own thread held.
 *
 * The scenario runs in a new process of this program
 * (tests/support/reexec.h), bounded: a hang is a failure. */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/reclaim.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <dlfcn.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
/* 16 MiB stacks: three cached ones pass glibc's 40 MiB bound */
#define THREADS 3
#define STACK (16 * MiB)

static char *(*touch)(void);
static sem_t touched;

static void *toucher(void *arg) {
    (void)arg;
    char *p = touch(); /* glibc mallocs this thread's 20 MiB block */
    sem_post(&touched);
    return p;
}

__attribute__((constructor(200))) static void scenario_main(void) {
    if (!getenv("LULL_TEST_TLS")) return;
    void *warm = lull_malloc(64); /* the modules start: the thread is deferred */
    lull_free(warm);
    void *lib = dlopen(BIG_TLS_PATH, RTLD_NOW);
    if (!lib) _exit(3);
    touch = (char *(*)(void))dlsym(lib, "big_tls_touch");
    if (!touch) _exit(3);
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstacksize(&attr, STACK);
    if (sem_init(&touched, 0, 0)) _exit(4);
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], &attr, toucher, NULL)) _exit(4);
    for (int i = 0; i < THREADS; i++)
        while (sem_wait(&touched) != 0)
            ;
    /* not deferred any more only where the process took over a second to
     * get here (LULL_RECLAIM_START_AFTER_MS): then nothing is tested */
    int before = atomic_load(&lull_reclaim_deferred); /* printed at the end: printf allocates */
    void *blocks[THREADS];
    for (int i = 0; i < THREADS; i++)
        if (pthread_join(t[i], &blocks[i]) || !blocks[i]) _exit(5);
    int after = atomic_load(&lull_reclaim_deferred);
    /* the next allocation's slow path starts it (a size class not used yet) */
    static void *fresh[64];
    for (int i = 0; i < 64; i++)
        if (!(fresh[i] = lull_malloc(3000))) _exit(6);
    printf("deferred_before_joins=%d\ndeferred_after_joins=%d\ndeferred_after_malloc=%d\n", before,
           after, atomic_load(&lull_reclaim_deferred));
    fflush(stdout);
    _exit(0);
}

Test(reclaim_start_tls, a_huge_tls_block_freed_in_a_join_does_not_create_the_thread) {
#ifndef LULL_OVERRIDE
    /* glibc's TLS blocks come from lull's malloc only where lull is malloc */
    cr_skip_test("a build that does not replace malloc (LULL_OVERRIDE=OFF)");
#endif
    const char *vars[] = {"LULL_TEST_TLS=1", NULL};
    child_run cr;
    reexec_run("test_reclaim_start_tls_scenario", vars, "huge_tls_join", 30000, &cr);
    reexec_assert_exited_0(&cr, "huge_tls_join");
    if (reexec_field(&cr, "deferred_before_joins") == LULL_RECLAIM_NOT_DEFERRED)
        cr_skip_test("the reclaim thread started before the joins (the process was a second "
                     "old): nothing to test\n%s",
                     cr.out);
    cr_assert_eq(reexec_field(&cr, "deferred_after_joins"), LULL_RECLAIM_WANTED,
                 "the huge frees in the joins did not want the thread, or created it\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "deferred_after_malloc"), LULL_RECLAIM_NOT_DEFERRED,
                 "the allocation after the joins did not start the thread\n%s", cr.out);
}
