/* fork() while the reclaim thread opens its purge backend and its refault
 * monitor, with the race harness holding the windows open (base/race.h,
 * LULL_RACE_RECLAIM_OPEN; built with -DLULL_RACE=ON).
 *
 * A fork child forgets the parent's ring, pidfd and monitor descriptors
 * (purge_backend_forget_after_fork, lull_refault_after_fork_child), but
 * only those the parent's copy records as open (ring_open, `opened`): one
 * the thread had opened and not yet recorded stayed open in the child, a
 * leaked descriptor (and, for the ring, its shared mappings: the child has
 * no use for either). The point is reached twice as the thread starts:
 * the ring's descriptor opened, ring_open not yet set; the refault
 * monitor's /proc/self/pagemap opened, `opened` not yet set. A fork
 * landing just after the open also meets the thread's first tick, whose
 * memory-short look opens /proc/meminfo and the cgroup's files for a few
 * microseconds: those were kept too (1 trial in 24, with the open fixed).
 *
 * Each trial is a fresh process (a reclaim thread starts once a process):
 * it notes its descriptors, starts the reclaim thread (without waiting for
 * it), waits until the thread has reached the trial's hit of the point
 * (and is held there, or has run through), and forks. The grandchild
 * compares its descriptors with the noted ones: it must have no other. A
 * trial's thread runs straight through the point in a quarter of the
 * trials (base/race.c), so the trials take several seeds. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim.h"
#include "tests/support/fd_snapshot.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define SEEDS 12
#define HITS 2 /* the ring, then the refault monitor */
#define MAX_DELAY_US 40000
#define WAIT_MS 5000
#define MSG_LEN 512

/* reclaim_thread.c's: the backend once the thread has opened it, else NULL */
const purge_backend *lull_reclaim_backend(void);

static char *msg; /* shared with the trials and their children */

/* The grandchild: only the descriptors the trial had before the thread. */
static int grandchild(const unsigned char *before) {
    char target[256];
    int fd = fd_new_since(before, target, sizeof target);
    if (fd < 0) return 0;
    snprintf(msg, MSG_LEN,
             "descriptor %d (%s) of the parent's reclaim thread is open in the fork child", fd,
             target);
    return 1;
}

/* One fresh process: 0 passed, 1 a leak (msg), 2 the point never reached
 * the hit, 3 a failure of the test itself. */
static int trial(uint64_t seed, unsigned hit) {
    void *p = lull_malloc(64); /* the modules start: the thread is deferred */
    if (!p) return 3;
    lull_free(p);
    unsigned char before[FD_SNAPSHOT_MAX];
    fd_snapshot(before);
    lull_race_arm(1u << LULL_RACE_RECLAIM_OPEN, seed, MAX_DELAY_US);
    lull_reclaim_start_now(); /* creates the thread, does not wait for it */
    uint64_t until = now_ms() + WAIT_MS;
    while (lull_race_hits(LULL_RACE_RECLAIM_OPEN) < hit) {
        /* the point not reached that often: no ring here (io_uring off),
         * or no monitor descriptor (refault_monitor=off): nothing to see */
        if (lull_reclaim_backend()) break;
        if (now_ms() > until) return 2;
        sched_yield();
    }
    pid_t pid = fork();
    if (pid < 0) return 3;
    if (pid == 0) _exit(grandchild(before));
    int status;
    if (waitpid(pid, &status, 0) != pid) return 3;
    lull_race_arm(0, 0, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 3;
}

Test(race_reclaim_open, fork_while_the_reclaim_thread_opens, .timeout = 600) {
    msg = mmap(NULL, MSG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(msg, MAP_FAILED);
    int failed = 0, trials = 0, failed_at[HITS + 1] = {0};
    char first[HITS + 1][MSG_LEN] = {""};
    for (unsigned hit = 1; hit <= HITS; hit++)
        for (uint64_t s = 0; s < SEEDS; s++) {
            uint64_t seed = 0x0be11ULL * (s + 1) + hit;
            msg[0] = '\0';
            pid_t pid = fork();
            cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
            if (pid == 0) _exit(trial(seed, hit));
            int status;
            cr_assert_eq(waitpid(pid, &status, 0), pid);
            cr_assert(WIFEXITED(status), "trial (hit %u, seed %llu) died of signal %d", hit,
                      (unsigned long long)seed, WTERMSIG(status));
            int code = WEXITSTATUS(status);
            cr_assert_neq(code, 2, "the thread never reached the point %u times (seed %llu)", hit,
                          (unsigned long long)seed);
            cr_assert_neq(code, 3, "trial (hit %u, seed %llu) failed", hit,
                          (unsigned long long)seed);
            trials++;
            if (code == 1) {
                failed++;
                if (failed_at[hit]++ == 0) snprintf(first[hit], MSG_LEN, "%s", msg);
            }
        }
    cr_assert_eq(failed, 0,
                 "%d of %d fork children kept a descriptor; forked at the ring's open: %d (the "
                 "first: %s); at the refault monitor's: %d (the first: %s)",
                 failed, trials, failed_at[1], first[1], failed_at[2], first[2]);
}
