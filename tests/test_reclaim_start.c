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

/* The event that must start the thread, by name. */
static void start_event(const char *event) {
    if (strcmp(event, "large_free") == 0) {
        char *p = lull_malloc(8 * MiB); /* a large span: freeing it gives slices back */
        memset(p, 1, 8 * MiB);
        lull_free(p);
    } else if (strcmp(event, "huge_free") == 0) {
        char *p = lull_malloc(64 * MiB);
        memset(p, 1, MiB);
        lull_free(p);
    } else if (strcmp(event, "abandoned_heap") == 0) {
        /* a worker's blocks outlive it; main frees them (remote frees into
         * its abandoned heap, which only the reclaim thread collects) */
        pthread_t t;
        if (pthread_create(&t, NULL, worker, NULL) || pthread_join(t, NULL)) _exit(6);
        /* not a thread count: TSan starts a thread of its own with the
         * program's first */
        printf("deferred_after_exit=%d\n", atomic_load(&lull_reclaim_deferred));
        for (int i = 0; i < WORKER_BLOCKS; i++)
            lull_free(worker_blocks[i]);
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

Test(reclaim_start, a_large_free_starts_the_thread) {
    child_run cr;
    run_event("large_free", &cr);
}

Test(reclaim_start, a_huge_free_starts_the_thread) {
    child_run cr;
    run_event("huge_free", &cr);
}

/* The exiting worker must not create it (its late allocations hold the
 * late heap's lock, and a thread it created would inherit what it set for
 * itself); main's remote frees into the abandoned heap do. */
Test(reclaim_start, remote_frees_into_an_abandoned_heap_start_the_thread) {
    child_run cr;
    run_event("abandoned_heap", &cr);
    cr_assert_eq(reexec_field(&cr, "deferred_after_exit"), LULL_RECLAIM_WANTED,
                 "the exiting worker started the reclaim thread (or did not want it)\n%s", cr.out);
}

Test(reclaim_start, a_process_a_second_old_starts_it_at_its_next_span) {
    child_run cr;
    run_event("age", &cr);
}
