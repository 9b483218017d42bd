/* The reclaim thread starts on first need (reclaim/reclaim.h), not with the
 * process: a program that execs or exits soon (a fork+exec of /bin/true
 * under LD_PRELOAD) pays for no thread, ring or monitor, and a fork child
 * stays single-threaded. Each case runs this program again
 * (tests/support/reexec.h), so that it starts from a process of its own,
 * and reports how many threads it has before and after the event that
 * must start the thread, and the new thread's CPU set and class: it is
 * created on whichever thread needed it, and must not inherit that
 * thread's pinning or class. */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/reclaim.h"
#include "tests/support/reexec.h"
#include "tests/support/task_list.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define WORKER_BLOCKS 20000

static void *worker_blocks[WORKER_BLOCKS];

static void *worker(void *arg) {
    (void)arg;
    for (int i = 0; i < WORKER_BLOCKS; i++) {
        worker_blocks[i] = lull_malloc(64);
        if (!worker_blocks[i]) _exit(5);
        memset(worker_blocks[i], 3, 64);
    }
    return NULL;
}

/* A free wants the thread but never creates it (reclaim.h): the state
 * right after the free, then an allocation that takes a span (a size class
 * not used yet), which starts it. */
/* The state just before the free: an allocation before it (the block, a
 * thread) starts the thread by itself once the process is a second old,
 * which a slow build (ThreadSanitizer) reaches; the test then has nothing
 * to learn of the free. */
static void before_the_free(void) {
    printf("deferred_before_free=%d\n", atomic_load(&lull_reclaim_deferred));
}

static void allocate_after_the_free(void) {
    printf("deferred_after_free=%d\n", atomic_load(&lull_reclaim_deferred));
    static void *fresh[64];
    for (int i = 0; i < 64; i++)
        fresh[i] = lull_malloc(2000);
    if (!fresh[63]) _exit(8);
}

#define SPAWNED 12
static pthread_t spawned[SPAWNED];

static void *leaf(void *arg) {
    return arg;
}

/* creates threads (their TLS vectors on this thread's heap), and exits:
 * its heap is abandoned, which wants the reclaim thread */
static void *spawner(void *arg) {
    for (int i = 0; i < SPAWNED; i++)
        if (pthread_create(&spawned[i], NULL, leaf, NULL)) _exit(9);
    return arg;
}

/* a thread with no heap joins them: past 40 MiB of cached stacks glibc
 * frees their TLS vectors holding its stack cache's lock, which
 * pthread_create takes (remote frees into the abandoned heap) */
static void *joiner(void *arg) {
    for (int i = 0; i < SPAWNED; i++)
        if (pthread_join(spawned[i], NULL)) _exit(10);
    return arg;
}

/* The event that must start the thread, by name. */
static void start_event(const char *event) {
    if (strcmp(event, "large_free") == 0) {
        char *p = lull_malloc(8 * MiB); /* a large span: freeing it gives slices back */
        memset(p, 1, 8 * MiB);
        before_the_free();
        lull_free(p);
        allocate_after_the_free();
    } else if (strcmp(event, "join_cached_stacks") == 0) {
        pthread_t a, j;
        if (pthread_create(&a, NULL, spawner, NULL) || pthread_join(a, NULL)) _exit(6);
        before_the_free();
        if (pthread_create(&j, NULL, joiner, NULL) || pthread_join(j, NULL)) _exit(6);
        allocate_after_the_free();
    } else if (strcmp(event, "huge_free") == 0) {
        char *p = lull_malloc(64 * MiB);
        memset(p, 1, MiB);
        before_the_free();
        lull_free(p);
        allocate_after_the_free();
    } else if (strcmp(event, "aligned_huge_free") == 0) {
        /* a program whose allocations are all aligned huge blocks (2 MiB
         * aligned buffers): none takes a span, and no queued mapping fits
         * an aligned block, so without the thread every freed one stayed
         * mapped and resident (30 of 64 MiB: 1.9 GiB of RSS, glibc 66 MiB) */
        char *p = lull_aligned_alloc(2 * MiB, 64 * MiB);
        if (!p) _exit(8);
        memset(p, 1, MiB);
        before_the_free();
        lull_free(p);
        printf("deferred_after_free=%d\n", atomic_load(&lull_reclaim_deferred));
        char *q = lull_aligned_alloc(2 * MiB, 64 * MiB);
        /* read at once: the thread count's opendir below mallocs, which
         * would start the thread itself */
        int after = atomic_load(&lull_reclaim_deferred);
        if (!q) _exit(8);
        printf("deferred_after_aligned_alloc=%d\n", after);
    } else if (strcmp(event, "abandoned_heap") == 0) {
        /* a worker's blocks outlive it; main frees them (remote frees into
         * its abandoned heap, which only the reclaim thread collects) */
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) || pthread_join(t, NULL)) _exit(6);
        /* not a thread count: TSan starts a thread of its own with the
         * program's first */
        printf("deferred_after_exit=%d\n", atomic_load(&lull_reclaim_deferred));
        before_the_free();
        for (int i = 0; i < WORKER_BLOCKS; i++)
            lull_free(worker_blocks[i]);
        allocate_after_the_free();
    } else if (strcmp(event, "age") == 0) {
        /* nothing given back, but the process has lived a second: its next
         * span taken starts the thread (its counter page is due) */
        struct timespec t = {1, 100 * 1000000L};
        nanosleep(&t, NULL);
        static void *kept[64];
        for (int i = 0; i < 64; i++) /* a size class not used yet: a span is taken */
            kept[i] = lull_malloc(3000);
        if (!kept[63]) _exit(7);
    }
}

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *event = getenv("LULL_TEST_START");
    if (!event) return;
    /* the creating thread pins itself to its last CPU and takes
     * SCHED_BATCH: the reclaim thread must have neither */
    unsigned long long process_cpus = task_cpu_mask(0);
    cpu_set_t one;
    CPU_ZERO(&one);
    int last = 63 - __builtin_clzll(process_cpus);
    CPU_SET(last, &one);
    sched_setaffinity(0, sizeof one, &one);
    struct sched_param sp = {0};
    sched_setscheduler(0, SCHED_BATCH, &sp);
    /* small blocks of a few sizes, malloc and free: the heap keeps its
     * emptied spans, nothing needs the thread */
    for (int i = 0; i < 10000; i++) {
        void *p = lull_malloc(16 + (size_t)(i % 8) * 16);
        memset(p, 2, 16);
        lull_free(p);
    }
    printf("threads_before=%d\n", task_count());
    printf("deferred_before=%d\n", atomic_load(&lull_reclaim_deferred));
    start_event(event);
    int threads = task_count();
    /* a thread that was created names itself first thing: wait for that */
    bool created = atomic_load(&lull_reclaim_deferred) == LULL_RECLAIM_NOT_DEFERRED;
    int tid = 0;
    for (int i = 0; created && !tid && i < 100000; i++) {
        tid = task_named("lull-reclaim");
        if (!tid) sched_yield();
    }
    printf("threads_after=%d\nreclaim_found=%d\n", threads, tid != 0);
    if (tid) {
        printf("reclaim_cpus_match=%d\n", task_cpu_mask(tid) == process_cpus);
        printf("reclaim_policy=%d\n", sched_getscheduler(tid));
    }
    fflush(stdout);
    _exit(0);
}

static void run_event(const char *event, child_run *cr) {
    char var[64];
    snprintf(var, sizeof var, "LULL_TEST_START=%s", event);
    const char *vars[] = {var, NULL};
    reexec_run("test_reclaim_start_scenario", vars, event, 60000, cr);
    reexec_assert_exited_0(cr, event);
    cr_assert_eq(reexec_field(cr, "threads_before"), 1,
                 "%s: the reclaim thread ran before anything needed it\n%s", event, cr->out);
    cr_assert_eq(reexec_field(cr, "deferred_before"), LULL_RECLAIM_DEFERRED, "%s\n%s", event,
                 cr->out);
    cr_assert_eq(reexec_field(cr, "reclaim_found"), 1, "%s: no lull-reclaim thread after it\n%s",
                 event, cr->out);
    cr_assert_eq(reexec_field(cr, "reclaim_cpus_match"), 1,
                 "%s: the reclaim thread took its creator's CPU set\n%s", event, cr->out);
    cr_assert_eq(reexec_field(cr, "reclaim_policy"), SCHED_OTHER,
                 "%s: the reclaim thread took its creator's class\n%s", event, cr->out);
}

/* A free wants the thread and the next allocation starts it; a free
 * never creates it (session 22: pthread_create from a free that glibc
 * made holding its stack cache's lock hung the process). */
static void expect_wanted_after_the_free(const child_run *cr, const char *event) {
    if (reexec_field(cr, "deferred_before_free") == LULL_RECLAIM_NOT_DEFERRED)
        cr_skip_test("%s: the process was a second old before the free, whose allocations "
                     "started the thread: the free is not what is tested",
                     event);
    cr_assert_eq(reexec_field(cr, "deferred_after_free"), LULL_RECLAIM_WANTED,
                 "%s: not wanted, or created by a free\n%s", event, cr->out);
}

Test(reclaim_start, an_aligned_huge_free_wants_the_thread_and_an_aligned_allocation_starts_it) {
    child_run cr;
    run_event("aligned_huge_free", &cr);
    expect_wanted_after_the_free(&cr, "aligned_huge_free");
    cr_assert_eq(reexec_field(&cr, "deferred_after_aligned_alloc"), LULL_RECLAIM_NOT_DEFERRED,
                 "the aligned huge allocation did not start the thread\n%s", cr.out);
}

Test(reclaim_start, a_large_free_wants_the_thread_and_an_allocation_starts_it) {
    child_run cr;
    run_event("large_free", &cr);
    expect_wanted_after_the_free(&cr, "large_free");
}

/* Joined threads whose stacks glibc's cache frees: their TLS vectors'
 * frees come from inside glibc's stack cache lock. A free that created
 * the thread there hung in pthread_create, every signal blocked (session
 * 22's review); the scenario's 60 s and SIGKILL catch that. */
Test(reclaim_start, frees_inside_a_join_do_not_create_the_thread) {
#ifndef LULL_OVERRIDE
    /* glibc's TLS vectors come from lull's malloc only where lull is malloc */
    cr_skip_test("a build that does not replace malloc (LULL_OVERRIDE=OFF)");
#endif
    child_run cr;
    run_event("join_cached_stacks", &cr);
    expect_wanted_after_the_free(&cr, "join_cached_stacks");
}

/* A huge free neither (a dlopen'ed library's thread-local array is one,
 * which glibc frees in a join: tests/test_reclaim_start_tls.c). */
Test(reclaim_start, a_huge_free_wants_the_thread_and_an_allocation_starts_it) {
    child_run cr;
    run_event("huge_free", &cr);
    expect_wanted_after_the_free(&cr, "huge_free");
}

/* The exiting worker must not create it (its late allocations hold the
 * late heap's lock, and a thread it created would inherit what it set for
 * itself); main's remote frees into the abandoned heap want it, and its
 * next allocation starts it. */
Test(reclaim_start, remote_frees_into_an_abandoned_heap_want_the_thread) {
    child_run cr;
    run_event("abandoned_heap", &cr);
    expect_wanted_after_the_free(&cr, "abandoned_heap");
    cr_assert_eq(reexec_field(&cr, "deferred_after_exit"), LULL_RECLAIM_WANTED,
                 "the exiting worker started the reclaim thread (or did not want it)\n%s", cr.out);
}

Test(reclaim_start, a_process_a_second_old_starts_it_at_its_next_span) {
    child_run cr;
    run_event("age", &cr);
}
