/* A thread with a cancellation pending that ends the process (exit's
 * handler counter_page_at_exit, and lull's _exit and exec wrappers, which
 * share its gate) while another thread opens the counter page: the gate
 * waits for the open in nanosleep, a cancellation point, and the ending
 * thread was cancelled there, `ending` raised for good and the exit left
 * half done (src/counter_page.c gate_enter). lull never acts on a
 * pthread_cancel() (docs/architecture.md, "Cancellation").
 *
 * Each trial runs in a child process of its own (the gate is entered once
 * a process): a thread opens a page and is held at the race point
 * counter_page_open (base/race.h; a -DLULL_RACE=ON build) with `opening`
 * set, and once it is there a second thread, its cancellation pending,
 * passes the gate. It must come back from it. Bounded by trials. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "base/config.h"
#include "src/counter_page.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/wait.h>
#include <unistd.h>

#define TRIALS 8
#define HOLD_US 200000 /* the open is held up to this long at the point */

static char page_name[64];

static void *open_page(void *arg) {
    (void)arg;
    return (void *)(intptr_t)counter_page_open(page_name);
}

static void *end_with_a_cancel_pending(void *arg) {
    (void)arg;
    int old;
    pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
    pthread_cancel(pthread_self()); /* pending: deferred, acts at a cancellation point */
    pthread_setcancelstate(PTHREAD_CANCEL_ENABLE, &old);
    counter_page_at_exit();
    return (void *)1;
}

/* In the child: 0 the ending thread came back, 1 it was cancelled in the
 * gate, 2 the opener never reached the point. */
static int trial(uint64_t seed) {
    lull_race_arm(1u << LULL_RACE_COUNTER_PAGE_OPEN, seed, HOLD_US);
    pthread_t opener, ender;
    if (pthread_create(&opener, NULL, open_page, NULL)) return 2;
    uint64_t until = now_ms() + 5000;
    while (lull_race_hits(LULL_RACE_COUNTER_PAGE_OPEN) == 0)
        if (now_ms() > until)
            return 2;
        else
            sched_yield();
    void *r;
    if (pthread_create(&ender, NULL, end_with_a_cancel_pending, NULL)) return 2;
    pthread_join(ender, &r);
    pthread_join(opener, NULL);
    counter_page_close();
    return r == PTHREAD_CANCELED ? 1 : 0;
}

Test(race_exit_cancel, a_thread_ending_the_process_with_a_cancel_pending_passes_the_gate,
     .timeout = 300) {
    void *p = lull_malloc(64); /* lull started */
    lull_free(p);
    /* the reclaim thread opens no page of its own meanwhile */
    __atomic_store_n(&lull_config.counter_page, false, __ATOMIC_RELAXED);
    counter_page_close();
    int cancelled = 0;
    for (uint64_t s = 0; s < TRIALS; s++) {
        snprintf(page_name, sizeof page_name, "/lull-race-cancel.%d.%d", (int)getpid(), (int)s);
        pid_t pid = fork();
        cr_assert_geq(pid, 0);
        if (pid == 0) _exit(trial(0xca9ce1ULL * (s + 1)));
        int status;
        cr_assert_eq(waitpid(pid, &status, 0), pid);
        cr_assert(WIFEXITED(status), "trial %d: child died of signal %d", (int)s, WTERMSIG(status));
        cr_assert_neq(WEXITSTATUS(status), 2, "trial %d: the open never reached its point", (int)s);
        cancelled += WEXITSTATUS(status) == 1;
    }
    cr_assert_eq(cancelled, 0,
                 "%d of %d threads with a cancel pending were cancelled in the exit's wait for "
                 "the counter page's open",
                 cancelled, TRIALS);
}
