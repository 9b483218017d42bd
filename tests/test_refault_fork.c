/* refault_monitor=on (userfaultfd WP_ASYNC) across fork: a child gets no
 * userfaultfd context (no UFFD_FEATURE_EVENT_FORK), so its copies of the
 * parent's segments are unregistered and carry no write-protect markers.
 * The child's reclaim thread registers its segments again; the slices the
 * parent had purged (free, FREE_CLEAN with a purge time: watched when taken
 * again) must then be write-protected again too, or every page of them
 * reads as written and a reuse counts all 16 pages as refaulted, written or
 * not. Checked directly, as tests/test_refault.c's check_armed does: with
 * the child's reclaim thread held after a tick (its segments registered),
 * no page of a purged free slice may read as written.
 *
 * The same for slices the parent took again after a purge and had not
 * scanned yet when it forked: their refault_watch bits come along, their
 * pages come unarmed, and the child's first scan counted every page of them
 * as written. Those refaults were the parent's: the child's scan of the
 * inherited memory must count at most the pages the parent wrote, not all.
 *
 * The scenario runs in a new process (the monitor is chosen at start, from
 * LULL_CONF): this program run again with LULL_TEST_REFAULT_FORK set. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "numa/arena.h"
#include "numa/slice_history.h"
#include "numa/slice_state.h"
#include "base/linux_compat.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/reclaim_wait.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define BLOCK ((size_t)64 << 10) /* one slice */
#define NBLOCKS 256
#define PAGE ((size_t)4096)
#define PAGES_PER_BLOCK (BLOCK / PAGE)

/* Pages of purged free slices that read as written (not write-protected),
 * with the reclaim thread held; UINT64_MAX on error. */
static uint64_t unarmed_pages(uint64_t *slices) {
    *slices = 0;
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return UINT64_MAX;
    if (!reclaim_hold()) {
        close(fd);
        return UINT64_MAX;
    }
    uint64_t unarmed = 0;
    for (int a = 0; a < lull_arena_count; a++)
        for (lull_segment *sg = atomic_load(&lull_arenas[a].segments); sg; sg = sg->next)
            for (unsigned i = LULL_META_SLICES; i < LULL_SLICES; i++) {
                bool clean = atomic_load(&lull_slice_maps_of(sg)->clean[i / 64]) >> (i % 64) & 1;
                if (!clean || atomic_load(&lull_slice_history_of(sg)->purged_ms[i]) == 0) continue;
                struct page_region v[PAGES_PER_BLOCK];
                struct pm_scan_arg arg;
                memset(&arg, 0, sizeof arg);
                arg.size = sizeof arg;
                arg.start = (uintptr_t)lull_slice_address(sg, i);
                arg.end = arg.start + LULL_SLICE_SIZE;
                arg.vec = (uintptr_t)v;
                arg.vec_len = PAGES_PER_BLOCK;
                arg.category_mask = PAGE_IS_WRITTEN;
                arg.return_mask = PAGE_IS_WRITTEN;
                long n = ioctl(fd, PAGEMAP_SCAN, &arg);
                if (n < 0) {
                    unarmed = UINT64_MAX;
                    continue;
                }
                (*slices)++;
                for (long k = 0; k < n && unarmed != UINT64_MAX; k++)
                    unarmed += (v[k].end - v[k].start) / PAGE;
            }
    reclaim_release();
    close(fd);
    return unarmed;
}

static struct lull_counters stats(void) {
    struct lull_counters c;
    memset(&c, 0, sizeof c);
    lull_stats(&c);
    return c;
}

/* The child: its own reclaim thread, a tick (which registers its segments),
 * then the check. Exit status 0 or the figures' failure. */
static void child_main(void) {
    if (!lull_reclaim_now() || !lull_reclaim_now()) _exit(20);
    uint64_t mech = stats().refault_mechanism;
    uint64_t slices, unarmed = unarmed_pages(&slices);
    dprintf(1, "child_mechanism=%llu\nchild_slices=%llu\nchild_unarmed=%llu\n",
            (unsigned long long)mech, (unsigned long long)slices, (unsigned long long)unarmed);
    _exit(0);
}

/* A tick hook of this test's that holds the reclaim thread (no scan) while
 * asked to; its flags are this file's, so a fork child can clear them
 * (tests/support/reclaim_hold's child would wait for a thread it has not). */
extern void (*lull_reclaim_tick_hook)(void);
static atomic_int hold_request, held;

static void hold_hook(void) {
    if (!atomic_load(&hold_request)) return;
    atomic_store(&held, 1);
    while (atomic_load(&hold_request))
        usleep(1000);
    atomic_store(&held, 0);
}

static uint64_t watched_slices(void) {
    uint64_t n = 0;
    for (int a = 0; a < lull_arena_count; a++)
        for (lull_segment *sg = atomic_load(&lull_arenas[a].segments); sg; sg = sg->next)
            for (unsigned w = 0; w < LULL_SLICE_WORDS; w++)
                n += (uint64_t)__builtin_popcountll(
                    atomic_load(&lull_slice_history_of(sg)->refault_watch[w]));
    return n;
}

static void watched_scenario(void) {
    dprintf(1, "mechanism=%llu\n", (unsigned long long)stats().refault_mechanism);
    lull_configure("purge_mode", "dontneed");
    lull_configure("warm_reserve_mb", "0");
    lull_set_purge_delay_ms(0);
    static void *b[NBLOCKS];
    for (size_t i = 0; i < NBLOCKS; i++) {
        b[i] = lull_malloc(BLOCK);
        if (!b[i]) _exit(3);
        memset(b[i], 0x5a, BLOCK);
    }
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(b[i]);
    if (!purge_everything_freed()) _exit(4);
    /* hold the thread: no scan between the reuse and the fork */
    __atomic_store_n(&lull_reclaim_tick_hook, hold_hook, __ATOMIC_RELEASE);
    atomic_store(&hold_request, 1);
    for (int i = 0; i < 20000 && !atomic_load(&held); i++)
        usleep(1000);
    if (!atomic_load(&held)) _exit(5);
    /* the purged slices taken again, one page of each written */
    for (size_t i = 0; i < NBLOCKS; i++) {
        b[i] = lull_malloc(BLOCK);
        if (!b[i]) _exit(3);
        *(volatile char *)b[i] = 1;
    }
    uint64_t watched = watched_slices();
    dprintf(1, "parent_watched=%llu\n", (unsigned long long)watched);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) _exit(6);
    if (pid == 0) {
        atomic_store(&hold_request, 0); /* no thread of the child is held */
        atomic_store(&held, 0);
        uint64_t seen0 = stats().refault_pages;
        if (!lull_reclaim_now()) _exit(20);
        if (stats().refault_mechanism != LULL_COUNTERS_REFAULT_UFFD_WP) _exit(21);
        settle_refault_scans();
        dprintf(1, "child_refault_pages=%llu\n",
                (unsigned long long)(stats().refault_pages - seen0));
        _exit(0);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) _exit(7);
    dprintf(1, "child_status=%d\n", status);
    atomic_store(&hold_request, 0);
    _exit(0);
}

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *sc = getenv("LULL_TEST_REFAULT_FORK");
    if (!sc) return;
    if (strcmp(sc, "watched") == 0) {
        if (!lull_reclaim_now()) {
            dprintf(1, "error=no reclaim thread\n");
            _exit(2);
        }
        watched_scenario();
    }
    if (!lull_reclaim_now()) {
        dprintf(1, "error=no reclaim thread\n");
        _exit(2);
    }
    dprintf(1, "mechanism=%llu\n", (unsigned long long)stats().refault_mechanism);
    /* every freed slice purged with MADV_DONTNEED, and nothing prefaulted */
    lull_configure("purge_mode", "dontneed");
    lull_configure("warm_reserve_mb", "0");
    lull_set_purge_delay_ms(0);
    static void *b[NBLOCKS];
    for (size_t i = 0; i < NBLOCKS; i++) {
        b[i] = lull_malloc(BLOCK);
        if (!b[i]) _exit(3);
        memset(b[i], 0x5a, BLOCK);
    }
    for (size_t i = 0; i < NBLOCKS; i++)
        lull_free(b[i]);
    if (!purge_everything_freed()) _exit(4);
    uint64_t slices, unarmed = unarmed_pages(&slices);
    dprintf(1, "parent_slices=%llu\nparent_unarmed=%llu\n", (unsigned long long)slices,
            (unsigned long long)unarmed);
    fflush(NULL);
    pid_t pid = fork();
    if (pid < 0) _exit(5);
    if (pid == 0) child_main();
    int status = 0;
    if (waitpid(pid, &status, 0) != pid) _exit(6);
    dprintf(1, "child_status=%d\n", status);
    _exit(0);
}

Test(refault_fork, a_fork_child_write_protects_the_purged_slices_again, .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_TEST_REFAULT_FORK=1", "LULL_CONF=refault_monitor=on", NULL};
    reexec_run("test_refault_fork_scenario", vars, "refault_fork", 180000, &cr);
    reexec_assert_exited_0(&cr, "refault_fork");
    if (reexec_field(&cr, "mechanism") != LULL_COUNTERS_REFAULT_UFFD_WP)
        cr_skip_test("userfaultfd WP_ASYNC unavailable here:\n%s", cr.out);
    cr_assert_gt(reexec_field(&cr, "parent_slices"), 0, "nothing purged:\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "parent_unarmed"), 0,
                 "the parent left purged pages unarmed:\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "child_status"), 0, "the child failed:\n%s\n%s", cr.out, cr.err);
    cr_assert_eq(reexec_field(&cr, "child_mechanism"), LULL_COUNTERS_REFAULT_UFFD_WP, "%s", cr.out);
    cr_assert_gt(reexec_field(&cr, "child_slices"), 0, "%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "child_unarmed"), 0,
                 "%llu pages of purged free slices are not write-protected in the child:\n%s",
                 (unsigned long long)reexec_field(&cr, "child_unarmed"), cr.out);
}

Test(refault_fork, a_fork_child_does_not_count_the_parents_refaults_as_all_written,
     .timeout = 180) {
    child_run cr;
    const char *vars[] = {"LULL_TEST_REFAULT_FORK=watched", "LULL_CONF=refault_monitor=on", NULL};
    reexec_run("test_refault_fork_scenario", vars, "refault_fork_watched", 180000, &cr);
    reexec_assert_exited_0(&cr, "refault_fork_watched");
    if (reexec_field(&cr, "mechanism") != LULL_COUNTERS_REFAULT_UFFD_WP)
        cr_skip_test("userfaultfd WP_ASYNC unavailable here:\n%s", cr.out);
    uint64_t watched = reexec_field(&cr, "parent_watched");
    cr_assert_gt(watched, 0, "no purged slice was taken again:\n%s", cr.out);
    cr_assert_eq(reexec_field(&cr, "child_status"), 0, "the child failed:\n%s\n%s", cr.out, cr.err);
    /* one page of each was written (by the parent): at most that */
    cr_assert_leq(reexec_field(&cr, "child_refault_pages"), watched,
                  "the child counted %llu refaulted pages for %llu slices with one page "
                  "written each:\n%s",
                  (unsigned long long)reexec_field(&cr, "child_refault_pages"),
                  (unsigned long long)watched, cr.out);
}
