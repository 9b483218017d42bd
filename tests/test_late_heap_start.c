/* A thread with no heap that allocates after its TSD destructors ran (told
 * by its signal mask, src/heap.c) allocates from the late heap, holding
 * late_lock. It must never start the reclaim thread there, nor wait for a
 * tick (reclaim/reclaim.h, lull_reclaim_no_start): pthread_create's own
 * allocations on that thread (pthread_attr_setaffinity_np's, glibc's TLS
 * vector) came back to the late heap and took late_lock again, and the
 * thread hung for good; a wait over the heap limit held the lock the
 * tick's collection takes. docs/architecture.md: such a thread is refused
 * at once over the limit.
 *
 * glibc blocks every signal but SIGSETXID once a thread's TSD destructors
 * have run; the worker here blocks them the same way (the system call:
 * glibc's sigprocmask never blocks SIGCANCEL) before it allocates. Each
 * scenario runs in a new process of this program (tests/support/reexec.h),
 * bounded: a hang is a failure. */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/reclaim.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

static size_t late_size;
static size_t late_alignment; /* 0: malloc */
static void *late_block;
static int late_errno;
static int deferred_after_late;
static sem_t go; /* the worker allocates once main has set the scene */
static pthread_t late;

/* As glibc's start_thread after the TSD destructors: every signal blocked
 * but SIGSETXID (33), SIGCANCEL (32) included. */
static void block_as_exiting_thread(void) {
    uint64_t mask = ~((uint64_t)1 << (33 - 1));
    if (syscall(SYS_rt_sigprocmask, SIG_BLOCK, &mask, NULL, sizeof mask) != 0) _exit(3);
}

/* allocates nothing before: it has no heap */
static void *late_thread(void *arg) {
    (void)arg;
    while (sem_wait(&go) != 0)
        ;
    block_as_exiting_thread();
    errno = 0;
    late_block =
        late_alignment ? lull_aligned_alloc(late_alignment, late_size) : lull_malloc(late_size);
    late_errno = errno;
    deferred_after_late = atomic_load(&lull_reclaim_deferred);
    return NULL;
}

/* created before the scene is set: pthread_create allocates, a start
 * point on main */
static void create_late_thread(void) {
    if (sem_init(&go, 0, 0) || pthread_create(&late, NULL, late_thread, NULL)) _exit(4);
}

static void run_late_thread(size_t alignment, size_t size) {
    late_alignment = alignment;
    late_size = size;
    sem_post(&go);
    if (pthread_join(late, NULL)) _exit(4);
}

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *event = getenv("LULL_TEST_LATE");
    if (!event) return;
    void *warm = lull_malloc(64); /* the core and the modules start: the thread is deferred */
    lull_free(warm);
    create_late_thread();
    printf("deferred_before=%d\n", atomic_load(&lull_reclaim_deferred));
    if (strcmp(event, "over_limit") == 0) {
        /* a huge block past the limit: the heap limit's relief */
        if (!lull_configure("heap_limit_mb", "16")) _exit(5);
        run_late_thread(0, 64 * MiB);
    } else if (strcmp(event, "wanted") == 0) {
        /* a span given back wants the thread: the late heap's first span
         * taken is a start point, under late_lock (an aligned allocation
         * passes no start point before; malloc's slow path has one, where
         * no lock is held yet) */
        char *p = lull_malloc(8 * MiB);
        if (!p) _exit(6);
        memset(p, 1, 8 * MiB);
        lull_free(p);
        printf("deferred_wanted=%d\n", atomic_load(&lull_reclaim_deferred));
        run_late_thread(64, 100);
    }
    printf("late_ok=%d\nlate_errno=%d\ndeferred_after_late=%d\n", late_block != NULL, late_errno,
           deferred_after_late);
    /* read after the late allocation: the statistics start the thread */
    lull_reclaim_stats s;
    lull_reclaim_get_stats(&s);
    printf("limit_waits=%llu\n", (unsigned long long)s.limit_waits);
    fflush(stdout);
    _exit(0);
}

static void run_scenario(const char *event, child_run *cr) {
    char var[64];
    snprintf(var, sizeof var, "LULL_TEST_LATE=%s", event);
    const char *vars[] = {var, NULL};
    reexec_run("test_late_heap_start_scenario", vars, event, 30000, cr);
    reexec_assert_exited_0(cr, event);
    cr_assert_eq(reexec_field(cr, "deferred_before"), LULL_RECLAIM_DEFERRED, "%s\n%s", event,
                 cr->out);
}

Test(late_heap_start, over_the_limit_a_late_allocation_is_refused_at_once) {
    child_run cr;
    run_scenario("over_limit", &cr);
    cr_assert_eq(reexec_field(&cr, "late_ok"), 0, "64 MiB under a 16 MiB limit\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "late_errno"), ENOMEM, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "deferred_after_late"), LULL_RECLAIM_DEFERRED,
                 "the late thread started the reclaim thread\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "limit_waits"), 0,
                 "the late thread waited for a tick holding late_lock\n%s", cr.out);
}

Test(late_heap_start, a_late_allocation_does_not_start_a_wanted_thread) {
    child_run cr;
    run_scenario("wanted", &cr);
    cr_assert_eq(reexec_field(&cr, "deferred_wanted"), LULL_RECLAIM_WANTED, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "late_ok"), 1, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "deferred_after_late"), LULL_RECLAIM_WANTED,
                 "the late thread started the reclaim thread\n%s", cr.out);
}
