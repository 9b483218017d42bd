/* fork() while another thread opens the counter page (src/counter_page.c),
 * or sweeps stale pages (the second test, point counter_page_sweep),
 * with the race harness holding the open between the page's mmap and the
 * close of its descriptor (base/race.h, point counter_page_open; a
 * -DLULL_RACE=ON build).
 *
 * The page's descriptor holds the page's lock (flock, which a fork child
 * shares) until it is closed, and its mapping holds it after that; the
 * mapping is kept from fork children (MADV_DONTFORK) only once the open
 * has made it. A child copied inside the open kept the descriptor and the
 * shared mapping of its parent's page: it held the parent's lock (a sweep
 * saw a dead parent's page alive as long as the child lived: a redis
 * BGSAVE child, a prefork worker) and could write the parent's page.
 *
 * Each trial: a thread opens a page under a name of its own and is held at
 * the point (or runs through it, a quarter of the seeds: base/race.c); the
 * main thread forks once the point is reached, and the child must have no
 * descriptor the process did not have before the open and no mapping of
 * the page. Bounded by trials (SEEDS), not by time. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "src/counter_page.h"
#include "base/config.h"
#include "tests/support/fd_snapshot.h"
#include "tests/support/race_fork.h"

#include <criterion/criterion.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SEEDS 16
#define MSG_LEN 512

static char *msg; /* shared with the children */
static char page_name[64];

/* The child: 0 nothing of the parent's page, 1 a descriptor or mapping (msg). */
static int child_check(const unsigned char *before) {
    char target[256];
    int fd = fd_new_since(before, target, sizeof target);
    if (fd >= 0) {
        snprintf(msg, MSG_LEN, "descriptor %d (%s), opened in the parent", fd, target);
        return 1;
    }
    FILE *maps = fopen("/proc/self/maps", "r");
    if (!maps) return 0;
    char line[512];
    int found = 0;
    while (!found && fgets(line, sizeof line, maps))
        if (strstr(line, page_name + 1)) {
            snprintf(msg, MSG_LEN, "a mapping of the parent's counter page: %.400s", line);
            found = 1;
        }
    fclose(maps);
    return found;
}

static void *open_page(void *arg) {
    (void)arg;
    return (void *)(intptr_t)counter_page_open(page_name);
}

static int child_check_before(void *before) {
    return child_check(before);
}

/* One trial: `run` on a thread of its own, held at `point` (seed s); the
 * main thread forks once the point is reached. The child's exit status:
 * 0 nothing of the parent's pages, 1 a descriptor or mapping (msg). */
static int fork_at(lull_race_point_id point, void *(*run)(void *), uint64_t s) {
    unsigned char before[FD_SNAPSHOT_MAX];
    fd_snapshot(before);
    msg[0] = '\0';
    void *rc;
    int kept =
        race_fork_at(point, 0xc0de0ULL * (s + 1), run, NULL, child_check_before, before, &rc);
    cr_assert_eq((intptr_t)rc, 0, "%s failed (%d)", lull_race_point_name(point), (int)(intptr_t)rc);
    return kept;
}

static void start_without_a_page_of_its_own(void) {
    msg = mmap(NULL, MSG_LEN, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(msg, MAP_FAILED);
    void *p = lull_malloc(64); /* lull started */
    lull_free(p);
    /* the reclaim thread opens no page of its own meanwhile */
    __atomic_store_n(&lull_config.counter_page, false, __ATOMIC_RELAXED);
    counter_page_close();
}

Test(race_counter_page_open, fork_while_another_thread_opens_the_page, .timeout = 300) {
    start_without_a_page_of_its_own();
    int failed = 0;
    char first[MSG_LEN] = "";
    for (uint64_t s = 0; s < SEEDS; s++) {
        snprintf(page_name, sizeof page_name, "/lull-race-open.%d.%d", (int)getpid(), (int)s);
        int kept = fork_at(LULL_RACE_COUNTER_PAGE_OPEN, open_page, s);
        counter_page_close();
        if (kept && failed++ == 0) snprintf(first, sizeof first, "%s", msg);
    }
    cr_assert_eq(failed, 0, "%d of %d fork children kept the parent's counter page (the first: %s)",
                 failed, SEEDS, first);
}

static void *sweep(void *arg) {
    (void)arg;
    counter_page_sweep();
    return NULL;
}

/* The sweep of stale pages (run after an open) opens each page of a
 * default name to judge it, and /dev/shm itself: a child copied meanwhile
 * kept those descriptors, and with a judged page's descriptor the shared
 * lock the sweep takes on it. The page here is a file of a default name
 * that is no page (empty): judged and left, so every seed finds it. */
Test(race_counter_page_open, fork_while_another_thread_sweeps_stale_pages, .timeout = 300) {
    start_without_a_page_of_its_own();
    /* a default name: lull.<digits>, a pid no process has (over pid_max) */
    snprintf(page_name, sizeof page_name, "/lull.%d%d", 9999999, (int)getpid() % 1000);
    char path[128];
    snprintf(path, sizeof path, "/dev/shm%s", page_name);
    int fd = open(path, O_CREAT | O_WRONLY | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0, "cannot create %s", path);
    close(fd);
    int failed = 0;
    char first[MSG_LEN] = "";
    for (uint64_t s = 0; s < SEEDS; s++)
        if (fork_at(LULL_RACE_COUNTER_PAGE_SWEEP, sweep, s) && failed++ == 0)
            snprintf(first, sizeof first, "%s", msg);
    unlink(path);
    cr_assert_eq(failed, 0, "%d of %d fork children kept a descriptor of the sweep (the first: %s)",
                 failed, SEEDS, first);
}
