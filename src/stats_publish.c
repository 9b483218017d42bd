/* Publishing the statistics on the shared-memory counter page: opened by
 * the reclaim thread a second after it starts (then the stale pages of
 * dead processes of this user are swept from /dev/shm), refreshed on its
 * tick (at most every PUBLISH_EVERY_MS), reopened at the next tick after a
 * failed exec, removed at exit, _exit and exec (src/counter_page.h).
 * Each tick also serves a heap profile request found on the page
 * (src/profile_request.c). Request threads never write the page. */
#include "src/counter_page.h"
#include "base/config.h"
#include "base/module.h"
#include "base/fork_exec.h"
#include "src/profile_request.h"
#include "src/stats.h"

#include <stdbool.h>
#include <time.h>

#define PUBLISH_EVERY_MS 50
/* Short-lived processes (a shell pipeline, git's helpers) get no page: a
 * process that exits or execs within this long leaves nothing in /dev/shm
 * even when it is killed. */
#define OPEN_AFTER_MS 1000

extern void (*lull_reclaim_tick_hook)(void);
extern void (*lull_reclaim_thread_start_hook)(void);
void lull_stats_publish_register(void);

static LULL_FORK_EXEC_DATA uint64_t last_publish_ns; /* 0 again in a fork child */
static uint64_t thread_start_ns;
static bool open_pending;

static uint64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static void publish_now(void) {
    struct lull_counters c;
    lull_stats_collect(&c);
    /* this thread serves the page's heap profile requests (publish_tick) */
    c.flags |= LULL_COUNTERS_F_PROFILE_REQUESTS;
    counter_page_publish(&c);
    last_publish_ns = mono_ns();
}

static void publish_start(void) {
    thread_start_ns = mono_ns();
    /* atomic: tests turn the page off while this thread starts */
    open_pending = __atomic_load_n(&lull_config.counter_page, __ATOMIC_RELAXED);
}

static void publish_tick(void) {
    bool open = false;
    if (open_pending && mono_ns() - thread_start_ns >= (uint64_t)OPEN_AFTER_MS * 1000000u) {
        open_pending = false;
        open = true;
    }
    /* an exec failed (its page was removed first), or one was under way
     * when the page was due: the process has lived its second already */
    if (counter_page_take_reopen() && __atomic_load_n(&lull_config.counter_page, __ATOMIC_RELAXED))
        open = true;
    if (open && !counter_page_name() && counter_page_open(lull_config.counter_page_name) == 0) {
        counter_page_sweep();
        publish_now();
    }
    if (!counter_page_name()) return;
    /* at every tick, so at most IDLE_TICK_MS (100 ms) apart while the
     * thread sleeps (LULL_COUNTERS_REQUEST_POLL_MS) */
    profile_request_serve();
    if (mono_ns() - last_publish_ns >= (uint64_t)PUBLISH_EVERY_MS * 1000000u) publish_now();
}

LULL_FORK_EXEC_TEXT static void publish_fork_child(void) {
    counter_page_after_fork_child();
    last_publish_ns = 0;
}

LULL_FORK_EXEC_TEXT void lull_stats_publish_register(void) {
    static const lull_module_hooks hooks = {
        .start = counter_page_process_start,
        .fork_prepare = counter_page_fork_prepare,
        .fork_parent = counter_page_fork_parent,
        .fork_child = publish_fork_child,
        .at_exit = counter_page_at_exit,
    };
    lull_reclaim_thread_start_hook = publish_start;
    lull_reclaim_tick_hook = publish_tick;
    lull_register_module(&hooks);
    counter_page_register_exit();
}
