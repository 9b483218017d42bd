/* Signals and lull's threads (issue 12, item 6). A program that blocks a
 * signal in its threads and takes it with sigwait or a signalfd relies on
 * no thread having it unblocked: a process-directed signal goes to any
 * thread that does not block it. So every thread lull creates (the reclaim
 * thread, and the io-wq workers of its ring, which inherit its mask) blocks
 * every signal from its first instruction on, and a fork child's reclaim
 * thread, started later from a request thread, too. */
#define _GNU_SOURCE
#include "lull.h"
#include "support/mem_check.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define SENDS 50

/* The name of thread tid of this process ("" if it is gone). */
static void thread_name(pid_t tid, char *out, size_t len) {
    char path[64];
    snprintf(path, sizeof path, "/proc/self/task/%d/comm", (int)tid);
    out[0] = '\0';
    if (!read_proc(path, out, len)) return;
    out[strcspn(out, "\n")] = '\0';
}

/* Calls fn for every thread of this process. */
static void each_thread(void (*fn)(pid_t tid, const char *name, void *arg), void *arg) {
    DIR *d = opendir("/proc/self/task");
    cr_assert_not_null(d, "opendir /proc/self/task: %s", strerror(errno));
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        char name[64];
        thread_name((pid_t)atoi(e->d_name), name, sizeof name);
        fn((pid_t)atoi(e->d_name), name, arg);
    }
    closedir(d);
}

static void find_reclaim(pid_t tid, const char *name, void *arg) {
    if (strcmp(name, "lull-reclaim") == 0) *(pid_t *)arg = tid;
}

static pid_t reclaim_tid(void) {
    pid_t tid = 0;
    each_thread(find_reclaim, &tid);
    return tid;
}

/* ---- process-directed signals --------------------------------------------------- */

static atomic_int handler_runs;
static _Atomic pid_t handler_tid;

static void on_usr1(int sig) {
    (void)sig;
    atomic_store(&handler_tid, gettid());
    atomic_fetch_add(&handler_runs, 1);
}

/* Sends SIGUSR1 to the process, whose own threads (this one) block it, and
 * tells who took it. The kernel hands a process-directed signal to a thread
 * that does not block it, if there is one, and that thread takes it on its
 * next return to user space; lull_reclaim_now() returns after a tick of the
 * reclaim thread, so after that thread has run. Then the signal is either
 * still pending (every thread blocks it: this thread takes it with
 * sigtimedwait) or a handler has run (on the thread that took it). */
static pid_t send_and_see_who_takes_it(const sigset_t *usr1) {
    int runs = atomic_load(&handler_runs);
    cr_assert_eq(kill(getpid(), SIGUSR1), 0);
    cr_assert(lull_reclaim_now());
    for (;;) {
        struct timespec poll = {0, 10 * 1000 * 1000};
        if (sigtimedwait(usr1, NULL, &poll) == SIGUSR1) return gettid();
        if (atomic_load(&handler_runs) != runs) return atomic_load(&handler_tid);
    }
}

Test(signals, a_signal_the_program_blocks_never_runs_on_lull_reclaim) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    pid_t reclaim = reclaim_tid();
    cr_assert_gt(reclaim, 0, "no thread named lull-reclaim");
    struct sigaction sa = {.sa_handler = on_usr1};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    cr_assert_eq(pthread_sigmask(SIG_BLOCK, &usr1, NULL), 0);
    int by_main = 0, on_reclaim = 0, elsewhere = 0;
    pid_t other = 0;
    for (int i = 0; i < SENDS; i++) {
        pid_t t = send_and_see_who_takes_it(&usr1);
        if (t == gettid())
            by_main++;
        else if (t == reclaim)
            on_reclaim++;
        else
            elsewhere++, other = t;
    }
    cr_assert_eq(on_reclaim, 0,
                 "%d of %d SIGUSR1 sent to the process ran their handler on lull-reclaim (tid %d), "
                 "which does not block it; sigwait in the main thread got %d",
                 on_reclaim, SENDS, (int)reclaim, by_main);
    char name[64] = "";
    if (other) thread_name(other, name, sizeof name);
    cr_assert_eq(by_main, SENDS, "%d signals ran their handler on thread %d (%s)", elsewhere,
                 (int)other, name);
}

/* ---- the masks, from /proc -------------------------------------------------------- */

/* Thread tid's blocked signals (SigBlk: bit n-1 is signal n). */
static bool blocked_mask(pid_t tid, uint64_t *mask) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    if (!read_proc(path, buf, sizeof buf)) return false;
    const char *b = strstr(buf, "\nSigBlk:");
    return b && sscanf(b + strlen("\nSigBlk:"), "%" SCNx64, mask) == 1;
}

/* The signals a thread can block: all but SIGKILL and SIGSTOP (the kernel
 * refuses) and glibc's own (32 .. SIGRTMIN-1: cancellation and setxid,
 * which pthread_sigmask leaves unblocked). */
static uint64_t blockable(void) {
    uint64_t m = 0;
    for (int sig = 1; sig <= 64; sig++)
        if (sig != SIGKILL && sig != SIGSTOP && (sig < 32 || sig >= SIGRTMIN))
            m |= (uint64_t)1 << (sig - 1);
    return m;
}

typedef struct {
    pid_t reclaim;
    char worker_prefix[32]; /* iou-wrk-<reclaim tid> */
    int checked, workers;
    pid_t bad;
    char bad_name[64];
    uint64_t bad_mask;
} mask_check;

static void check_mask(pid_t tid, const char *name, void *arg) {
    mask_check *c = arg;
    bool worker = strncmp(name, c->worker_prefix, strlen(c->worker_prefix)) == 0;
    if (tid != c->reclaim && !worker) return;
    uint64_t m;
    if (!blocked_mask(tid, &m)) return; /* an idle worker that just exited */
    c->checked++;
    c->workers += worker;
    if ((m & blockable()) != blockable() && !c->bad) {
        c->bad = tid;
        c->bad_mask = m;
        snprintf(c->bad_name, sizeof c->bad_name, "%s", name);
    }
}

/* Every thread lull has in this process blocks every signal it can; 0 or
 * the exit code that says what failed (for a fork child). */
static void check_lull_threads(mask_check *c) {
    *c = (mask_check){.reclaim = reclaim_tid()};
    snprintf(c->worker_prefix, sizeof c->worker_prefix, "iou-wrk-%d", (int)c->reclaim);
    if (c->reclaim) each_thread(check_mask, c);
}

/* Make the reclaim thread purge through its ring, so that its io-wq
 * workers exist. */
static void purge_something(void) {
    lull_set_purge_delay_ms(0);
    char *p = lull_malloc(4 * MiB);
    cr_assert_not_null(p);
    memset(p, 1, 4 * MiB);
    lull_free(p);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
}

Test(signals, lull_threads_block_every_signal) {
    purge_something();
    mask_check c;
    check_lull_threads(&c);
    cr_assert_gt(c.reclaim, 0, "no thread named lull-reclaim");
    cr_log_info("checked lull-reclaim and %d io-wq workers", c.workers);
    cr_assert_eq(c.bad, 0,
                 "thread %d (%s) blocks %#" PRIx64 ", not %#" PRIx64 " (unblocked: %#" PRIx64 ")",
                 (int)c.bad, c.bad_name, c.bad_mask, blockable(), blockable() & ~c.bad_mask);
}

/* A fork child's reclaim thread is created later, by whichever request
 * thread frees first: it blocks every signal too, and the creating thread's
 * own mask is what it was. */
static int child_main(void) {
    sigset_t before, after;
    pthread_sigmask(SIG_SETMASK, NULL, &before);
    char *h = lull_malloc(40 * MiB); /* huge: its free hands it to the reclaim thread */
    if (!h) return 10;
    lull_free(h);
    if (!lull_reclaim_now()) return 11;
    pthread_sigmask(SIG_SETMASK, NULL, &after);
    for (int sig = 1; sig < NSIG; sig++)
        if (sigismember(&before, sig) != sigismember(&after, sig)) return 12;
    mask_check c;
    check_lull_threads(&c);
    if (!c.reclaim) return 13;
    if (c.bad) return 14;
    return 0;
}

Test(signals, a_fork_childs_reclaim_thread_blocks_every_signal) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) _exit(child_main());
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
    cr_assert_eq(WEXITSTATUS(status), 0,
                 "child step %d failed (10: malloc, 11: no reclaim thread, 12: the freeing "
                 "thread's mask changed, 13: no lull-reclaim found, 14: a lull thread does not "
                 "block every signal)",
                 WEXITSTATUS(status));
}
