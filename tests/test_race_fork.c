/* fork() while the reclaim thread purges (issue 12, item 4), with the race
 * harness holding its windows open (base/race.h; built with -DLULL_RACE=ON).
 *
 * The main thread churns blocks of 64 KiB - 1 MiB (so that slices go dirty
 * all the time) while the reclaim thread purges them at once (delay 0), and
 * forks between two of its own operations, so that at each fork the only
 * thread that can be half way through moving a slice is the reclaim thread:
 * armed points hold it between claiming dirty bits and marking them PURGING,
 * before the purge, and between setting the target map and clearing
 * PURGING, and hold the fork inside its prepare handler. Each child checks
 * the slice invariant strictly (tests/support/slice_check.h: every slice in
 * exactly one state, none leaked), then takes spans of its own and checks
 * that none overlaps another or a block the parent had live, and that no
 * block's content changed. The parent forks until every point has been hit
 * (at least MIN_FORKS times, at most MAX_FORKS: bounded by forks, not by
 * time) and asserts that every child exited 0. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "support/mem_check.h"
#include "support/slice_check.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define SLOTS 24
#define CHURN_PER_FORK 16
#define CHILD_BLOCKS 48
#define MIN_FORKS 40
#define MAX_FORKS 400
#define MAX_DELAY_US 300
#define SEED 0x5eedf0e4ULL

/* With LULL_OVERRIDE the process's other threads (the reclaim thread's own
 * libc calls, Criterion's) allocate from lull too and may be half way
 * through a span at fork: a slice in no map and no span is then theirs, not
 * a leak. */
#ifdef LULL_OVERRIDE
#define STRICT false
#else
#define STRICT true
#endif

static const lull_race_point_id points[] = {LULL_RACE_RECLAIM_CLAIM, LULL_RACE_RECLAIM_PURGE,
                                            LULL_RACE_RECLAIM_FINISH, LULL_RACE_FORK};
#define NPOINTS (sizeof points / sizeof points[0])

/* the parent's live blocks (the child inherits them) */
static void *blk[SLOTS];
static size_t blk_size[SLOTS];
static uint64_t blk_seed[SLOTS];

/* what the failing child saw, for the parent's message */
static char *child_msg;
#define CHILD_MSG_LEN 512

static size_t block_size(uint64_t r) {
    return 64 * KiB + (size_t)(r % (960 * KiB));
}

static void churn(uint64_t *rng, int ops) {
    for (int i = 0; i < ops; i++) {
        uint64_t r = rng_next(rng);
        unsigned k = (unsigned)(r % SLOTS);
        lull_free(blk[k]);
        blk_size[k] = block_size(r >> 8);
        blk_seed[k] = r;
        blk[k] = lull_malloc(blk_size[k]);
        cr_assert_not_null(blk[k]);
        pat_fill(blk[k], blk_size[k], blk_seed[k]);
    }
}

static int child_fail(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(child_msg, CHILD_MSG_LEN, fmt, ap);
    va_end(ap);
    return code;
}

static bool overlaps(const void *a, size_t an, const void *b, size_t bn) {
    return (const char *)a < (const char *)b + bn && (const char *)b < (const char *)a + an;
}

/* A block the child took overlaps none taken before and none the parent
 * had live. */
static int check_new_block(void *const *p, const size_t *n, int k) {
    for (int j = 0; j < k; j++)
        if (overlaps(p[k], n[k], p[j], n[j]))
            return child_fail(12, "the child's blocks %d (%p, %zu B) and %d (%p, %zu B) overlap", k,
                              p[k], n[k], j, p[j], n[j]);
    for (int s = 0; s < SLOTS; s++)
        if (overlaps(p[k], n[k], blk[s], blk_size[s]))
            return child_fail(13,
                              "the child's block %d (%p, %zu B) overlaps the parent's live "
                              "block %d (%p, %zu B)",
                              k, p[k], n[k], s, blk[s], blk_size[s]);
    return 0;
}

static int check_parent_blocks(const char *when) {
    for (int s = 0; s < SLOTS; s++)
        if (!pat_check(blk[s], blk_size[s], blk_seed[s]))
            return child_fail(14, "the parent's block %d (%p) changed %s", s, blk[s], when);
    return 0;
}

static int child_main(void) {
    lull_race_arm(0, 0, 0); /* the child's own steps run straight through */
    char msg[256];
    slice_check_counts c;
    if (!slice_check(STRICT, &c, msg, sizeof msg))
        return child_fail(10, "slice invariant after fork: %s", msg);
    int r = check_parent_blocks("through the fork");
    if (r) return r;
    void *p[CHILD_BLOCKS];
    size_t n[CHILD_BLOCKS];
    for (int k = 0; k < CHILD_BLOCKS; k++) {
        n[k] = block_size(mix64((uint64_t)k + 1));
        p[k] = lull_malloc(n[k]);
        if (!p[k]) return child_fail(11, "malloc(%zu) failed in the child", n[k]);
        if ((r = check_new_block(p, n, k))) return r;
        pat_fill(p[k], n[k], (uint64_t)k);
    }
    for (int k = 0; k < CHILD_BLOCKS; k++)
        if (!pat_check(p[k], n[k], (uint64_t)k))
            return child_fail(15, "the child's block %d (%p) was overwritten", k, p[k]);
    if ((r = check_parent_blocks("after the child's mallocs"))) return r;
    if (!slice_check(STRICT, &c, msg, sizeof msg))
        return child_fail(16, "slice invariant after the child's mallocs: %s", msg);
    return 0;
}

static bool all_points_hit(void) {
    for (size_t i = 0; i < NPOINTS; i++)
        if (lull_race_hits(points[i]) == 0) return false;
    return true;
}

Test(race_fork, fork_while_the_reclaim_thread_purges, .timeout = 600) {
    child_msg =
        mmap(NULL, CHILD_MSG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(child_msg, MAP_FAILED);
    lull_set_purge_delay_ms(0);
    uint64_t rng = SEED;
    for (int k = 0; k < SLOTS; k++) {
        blk_size[k] = block_size(rng_next(&rng));
        blk_seed[k] = (uint64_t)k;
        blk[k] = lull_malloc(blk_size[k]);
        cr_assert_not_null(blk[k]);
        pat_fill(blk[k], blk_size[k], blk_seed[k]);
    }
    uint32_t mask = 0;
    for (size_t i = 0; i < NPOINTS; i++)
        mask |= 1u << points[i];
    lull_race_arm(mask, SEED, MAX_DELAY_US);

    int forks = 0, failed = 0, first_fork = -1, first_status = 0;
    char first_msg[CHILD_MSG_LEN] = "";
    while (forks < MAX_FORKS && (forks < MIN_FORKS || !all_points_hit())) {
        churn(&rng, CHURN_PER_FORK);
        child_msg[0] = '\0';
        pid_t pid = fork();
        cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
        if (pid == 0) _exit(child_main());
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && failed++ == 0) {
            first_fork = forks;
            first_status = status;
            snprintf(first_msg, sizeof first_msg, "%s", child_msg);
        }
        forks++;
    }
    uint64_t hits[NPOINTS];
    for (size_t i = 0; i < NPOINTS; i++)
        hits[i] = lull_race_hits(points[i]);
    lull_race_arm(0, 0, 0);
    cr_log_info("%d forks; hits: claim %llu, purge %llu, finish %llu, fork %llu", forks,
                (unsigned long long)hits[0], (unsigned long long)hits[1],
                (unsigned long long)hits[2], (unsigned long long)hits[3]);
    cr_assert_eq(failed, 0, "%d of %d children failed; the first (fork %d) %s %d: %s", failed,
                 forks, first_fork, WIFEXITED(first_status) ? "exited with" : "died of signal",
                 WIFEXITED(first_status) ? WEXITSTATUS(first_status) : WTERMSIG(first_status),
                 first_msg[0] ? first_msg : "(no message)");
    for (size_t i = 0; i < NPOINTS; i++)
        cr_assert_gt(hits[i], 0, "race point %s never hit in %d forks",
                     lull_race_point_name(points[i]), forks);
    for (int k = 0; k < SLOTS; k++) {
        cr_assert(pat_check(blk[k], blk_size[k], blk_seed[k]), "the parent's block %d changed", k);
        lull_free(blk[k]);
    }
}
