/* fork() from a multi-threaded process (src/init.c fork handlers): while two
 * threads allocate and free continuously and the reclaim thread purges at
 * once (delay 0), the main thread forks 20 times. Each child allocates and
 * frees small, large and huge blocks, checks their patterns and the parent's
 * blocks it inherited, frees blocks the parent's threads owned, runs its own
 * reclaim thread (lull_reclaim_now() is true) and exits 0. The parent's
 * threads keep working throughout.
 *
 * A child starts single-threaded: its reclaim thread starts only once it
 * has something to purge (issue 12, item 5), so a child that execs at once
 * pays for no thread, and one that unshares a user namespace can. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/reclaim.h"
#include "support/hang_report.h"
#include "support/mem_check.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define FORKS 20
#define WORKERS 2
#define SLOTS 32

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* Pattern every 64 bytes, every 64 KiB above 64 KiB (a page fault costs
 * tens of microseconds in some VMs), and in the last word. */
static size_t step(size_t size) {
    return size > 64 * KiB ? 64 * KiB : 64;
}

static void fill(void *p, size_t size, uint64_t seed) {
    uint64_t *w = p;
    for (size_t off = 0; off + 16 <= size; off += step(size))
        w[off / 8] = mix((uintptr_t)p ^ seed ^ off);
    if (size >= 8) memcpy((char *)p + size - 8, &(uint64_t){mix(seed ^ size)}, 8);
}

static bool check(const void *p, size_t size, uint64_t seed) {
    const uint64_t *w = p;
    for (size_t off = 0; off + 16 <= size; off += step(size))
        if (w[off / 8] != mix((uintptr_t)p ^ seed ^ off)) return false;
    uint64_t last;
    if (size >= 8) {
        memcpy(&last, (const char *)p + size - 8, 8);
        if (last != mix(seed ^ size)) return false;
    }
    return true;
}

/* ---- the parent's busy threads ------------------------------------------ */

typedef struct {
    _Atomic(void *) p;
    _Atomic size_t size;
    _Atomic uint64_t seed;
} slot;

static atomic_bool stop, worker_failed;
static atomic_ulong worker_ops[WORKERS];
/* blocks owned by the workers' heaps that a child frees (remote frees into
 * heaps whose threads do not exist in the child) */
static _Atomic(void *) shared_block[WORKERS];

static size_t worker_size(uint64_t r) {
    uint64_t k = r % 100;
    if (k < 80) return 8 + (r >> 8) % 1000;
    if (k < 97) return 1024 + (r >> 8) % (200 * KiB);
    return 600 * KiB + (r >> 8) % MiB;
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t x = 0x9e3779b97f4a7c15ULL * (uint64_t)(id + 1);
    void *p[SLOTS] = {0};
    size_t sz[SLOTS] = {0};
    uint64_t sd[SLOTS] = {0};
    void *shared = lull_malloc(100);
    memset(shared, 0x5a, 100);
    atomic_store(&shared_block[id], shared);
    while (!atomic_load_explicit(&stop, memory_order_relaxed)) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned i = (unsigned)(x % SLOTS);
        if (p[i]) {
            if (!check(p[i], sz[i], sd[i])) atomic_store(&worker_failed, true);
            lull_free(p[i]);
            p[i] = NULL;
        }
        sz[i] = worker_size(x >> 6);
        p[i] = lull_malloc(sz[i]);
        if (!p[i]) {
            atomic_store(&worker_failed, true);
            break;
        }
        sd[i] = x;
        fill(p[i], sz[i], sd[i]);
        atomic_fetch_add_explicit(&worker_ops[id], 1, memory_order_relaxed);
    }
    for (unsigned i = 0; i < SLOTS; i++)
        if (p[i]) {
            if (!check(p[i], sz[i], sd[i])) atomic_store(&worker_failed, true);
            lull_free(p[i]);
        }
    return NULL;
}

/* ---- the child ------------------------------------------------------------ */

/* Blocks of the main thread, allocated before the forks: the child sees
 * them intact and may free them. */
#define INHERITED 32
static void *inherited[INHERITED];
static size_t inherited_size[INHERITED];

static int child_main(int round) {
    /* the parent's blocks came through the fork intact */
    for (int i = 0; i < INHERITED; i++)
        if (inherited[i] && !check(inherited[i], inherited_size[i], (uint64_t)i)) return 10;
    /* small, large and huge blocks of the child's own */
    static const size_t sizes[] = {8,         100, 1000,    5000,     70 * KiB,
                                   300 * KiB, MiB, 5 * MiB, 17 * MiB, 24 * MiB};
    void *p[sizeof sizes / sizeof sizes[0]];
    for (int rep = 0; rep < 3; rep++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            p[k] = lull_malloc(sizes[k]);
            if (!p[k]) return 11;
            fill(p[k], sizes[k], (uint64_t)(round * 100 + rep) + k);
        }
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            if (!check(p[k], sizes[k], (uint64_t)(round * 100 + rep) + k)) return 12;
            lull_free(p[k]);
        }
    }
    /* a thousand small ones, reallocated, freed */
    void *many[1000];
    for (int i = 0; i < 1000; i++) {
        many[i] = lull_malloc(16 + (size_t)i % 300);
        if (!many[i]) return 13;
        fill(many[i], 16 + (size_t)i % 300, (uint64_t)i);
    }
    for (int i = 0; i < 1000; i++) {
        if (!check(many[i], 16 + (size_t)i % 300, (uint64_t)i)) return 14;
        many[i] = lull_realloc(many[i], 2000 + (size_t)i);
        if (!many[i]) return 15;
    }
    for (int i = 0; i < 1000; i++)
        lull_free(many[i]);
    /* blocks owned by the parent's other threads, which do not exist here */
    for (int w = 0; w < WORKERS; w++) {
        unsigned char *s = atomic_load(&shared_block[w]);
        if (s) {
            if (s[0] != 0x5a || s[99] != 0x5a) return 16;
            lull_free(s);
        }
    }
    /* the parent's main-thread blocks, now the child's */
    for (int i = 0; i < INHERITED; i += 2)
        lull_free(inherited[i]); /* NULL: none */
    /* the child has a reclaim thread of its own, and it works */
    if (!lull_reclaim_now()) return 17;
    if (!lull_reclaim_now()) return 17;
    void *after = lull_malloc(20 * MiB);
    if (!after) return 18;
    memset(after, 1, MiB);
    lull_free(after);
    if (!lull_reclaim_now()) return 17;
    return 0;
}

/* Wait for pid up to `seconds`; kill it if it hangs. */
static int wait_child(pid_t pid, int seconds, bool *hung) {
    int status = 0;
    *hung = false;
    for (int i = 0; i < seconds * 100; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) return status;
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    *hung = true;
    hang_report(pid, stderr);
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

Test(fork, fork_while_threads_allocate_and_the_reclaim_thread_purges, .timeout = 240) {
    lull_set_purge_delay_ms(0);
    for (int i = 0; i < INHERITED; i++) {
        inherited_size[i] = i % 4 == 3 ? 2 * MiB + (size_t)i : 24 + (size_t)i * 37;
        inherited[i] = lull_malloc(inherited_size[i]);
        cr_assert_not_null(inherited[i]);
        fill(inherited[i], inherited_size[i], (uint64_t)i);
    }
    pthread_t t[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, worker, (void *)(intptr_t)i), 0);
    /* let the workers get going */
    while (atomic_load(&worker_ops[0]) < 1000 || atomic_load(&worker_ops[WORKERS - 1]) < 1000)
        sched_yield();

    int failures = 0, first_status = 0, first_round = -1;
    bool any_hung = false;
    for (int round = 0; round < FORKS; round++) {
        pid_t pid = fork();
        cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
        if (pid == 0) _exit(child_main(round));
        bool hung;
        int status = wait_child(pid, 30, &hung);
        if (hung || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            if (!failures++) {
                first_status = status;
                first_round = round;
                any_hung = hung;
            }
        }
        struct timespec ts = {0, 2 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    unsigned long before_stop[WORKERS];
    for (int w = 0; w < WORKERS; w++)
        before_stop[w] = atomic_load(&worker_ops[w]);
    /* the parent's threads are still running after the last fork (a
     * deadlock left by a fork handler would hang here until the timeout) */
    for (int w = 0; w < WORKERS; w++)
        while (atomic_load(&worker_ops[w]) < before_stop[w] + 100)
            sched_yield();
    atomic_store(&stop, true);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(t[i], NULL);

    cr_assert_not(any_hung, "child of round %d hung (deadlock after fork?)", first_round);
    cr_assert_eq(failures, 0,
                 "%d of %d children failed; first: round %d, %s %d (exit codes: 10 inherited "
                 "block broken, 11 malloc failed, 12/14 pattern broken, 16 worker's block "
                 "broken, 17 no reclaim thread, 18 huge malloc failed)",
                 failures, FORKS, first_round, WIFEXITED(first_status) ? "exit" : "signal",
                 WIFEXITED(first_status) ? WEXITSTATUS(first_status) : WTERMSIG(first_status));
    cr_assert_not(atomic_load(&worker_failed), "a parent thread's block was broken");
    for (int i = 0; i < INHERITED; i++) {
        cr_assert(check(inherited[i], inherited_size[i], (uint64_t)i),
                  "the parent's block %d changed", i);
        lull_free(inherited[i]);
    }
    cr_assert(lull_reclaim_now());
}

/* A child of a child: the fork handlers leave a state that forks again. */
/* (Under AddressSanitizer too: the child forks before it has a reclaim
 * thread, so no thread of its can hold ASan's allocator lock at that fork,
 * which used to hang the grandchild.) */
Test(fork, a_child_forks_again, .timeout = 60) {
    void *p = lull_malloc(1000);
    cr_assert_not_null(p);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        lull_free(p);
        pid_t grandchild = fork();
        if (grandchild < 0) _exit(20);
        if (grandchild == 0) _exit(child_main(99) == 0 && lull_reclaim_now() ? 0 : 21);
        bool hung;
        int st = wait_child(grandchild, 30, &hung);
        if (hung || !WIFEXITED(st)) _exit(22);
        if (WEXITSTATUS(st) != 0) _exit(WEXITSTATUS(st));
        _exit(lull_reclaim_now() ? 0 : 23);
    }
    bool hung;
    int status = wait_child(pid, 40, &hung);
    cr_assert_not(hung);
    cr_assert(WIFEXITED(status), "signal %d", WTERMSIG(status));
    cr_assert_eq(WEXITSTATUS(status), 0);
    lull_free(p);
}

/* ---- the child's reclaim thread starts on first need ---------------------- */

/* Threads of this process, from /proc/self/status: read without stdio or
 * opendir, which allocate (and an allocation is what starts the thread). */
static int thread_count(void) {
    char buf[4096];
    if (!read_proc("/proc/self/status", buf, sizeof buf)) return -1;
    const char *t = strstr(buf, "\nThreads:");
    return t ? atoi(t + strlen("\nThreads:")) : -1;
}

/* Runs fn in a fork child and returns its exit status (fails the test if it
 * died of a signal). */
static int in_child(int (*fn)(void)) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) _exit(fn());
    bool hung;
    int status = wait_child(pid, 60, &hung);
    cr_assert_not(hung, "the child hung");
    cr_assert(WIFEXITED(status), "the child died of signal %d", WTERMSIG(status));
    return WEXITSTATUS(status);
}

static int child_thread_count(void) {
    int n = thread_count();
    return n < 0 ? 100 : n > 99 ? 99 : n;
}

Test(fork, a_child_starts_with_one_thread) {
    cr_assert(lull_reclaim_now(), "the parent has no reclaim thread");
    int n = in_child(child_thread_count);
    cr_assert_neq(n, 100, "cannot read /proc/self/status in the child");
    cr_assert_eq(n, 1,
                 "the child has %d threads right after fork (lull started its reclaim "
                 "thread in the atfork handler)",
                 n);
}

/* Whether unshare(CLONE_NEWUSER) works for a single-threaded process here
 * (it needs privilege or unprivileged user namespaces): tried in a child
 * made with the raw system call, which runs no atfork handler, so lull
 * starts nothing in it, and which makes no call but the two below. */
static bool user_namespaces_allowed(void) {
    pid_t pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
    if (pid == 0) syscall(SYS_exit_group, syscall(SYS_unshare, CLONE_NEWUSER) == 0 ? 0 : 1);
    cr_assert_geq(pid, 0, "clone: %s", strerror(errno));
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    return WIFEXITED(status) && WEXITSTATUS(status) == 0;
}

static int child_unshare(void) {
    return unshare(CLONE_NEWUSER) == 0 ? 0 : errno;
}

Test(fork, a_child_can_enter_a_user_namespace) {
    if (!user_namespaces_allowed())
        cr_skip_test("unshare(CLONE_NEWUSER) fails here even in a single-threaded process");
    cr_assert(lull_reclaim_now(), "the parent has no reclaim thread");
    int err = in_child(child_unshare);
    cr_assert_eq(err, 0,
                 "unshare(CLONE_NEWUSER) in the child: %s (EINVAL: the child is "
                 "multi-threaded)",
                 strerror(err));
}

static uint64_t purged_pages(void) {
    struct lull_counters c;
    lull_stats(&c);
    return c.purged_pages;
}

/* A large block freed, then a span taken: the child's thread has started
 * (no call asked for it), and it purges what the child frees. */
static int child_frees_spans(void) {
    if (thread_count() != 1) return 10;
    char *a = lull_malloc(2 * MiB), *b = lull_malloc(100);
    if (!a || !b) return 11;
    memset(a, 1, 2 * MiB);
    lull_free(a); /* dirty slices: something to purge */
    char *c = lull_malloc(4 * MiB);
    if (!c) return 11;
    if (thread_count() < 2) return 12;
    uint64_t before = purged_pages();
    memset(c, 1, 4 * MiB);
    lull_free(c);
    if (!lull_reclaim_now()) return 13;
    if (purged_pages() <= before) return 14;
    lull_free(b);
    return 0;
}

Test(fork, a_child_starts_its_reclaim_thread_once_it_frees_spans) {
    lull_set_purge_delay_ms(0);
    int r = in_child(child_frees_spans);
    cr_assert_eq(r, 0,
                 "child step %d failed (10: more than one thread after fork, 11: malloc failed, "
                 "12: no reclaim thread after a free and a malloc, 13: lull_reclaim_now() "
                 "false, 14: nothing purged)",
                 r);
}

/* A huge block freed wants the thread, as any free does (a free never
 * creates it, reclaim.h); the next allocation starts it. */
static int child_frees_huge(void) {
    if (thread_count() != 1) return 10;
    char *h = lull_malloc(40 * MiB);
    if (!h) return 11;
    memset(h, 1, MiB);
    if (thread_count() != 1) return 12;
    lull_free(h);
    if (atomic_load(&lull_reclaim_deferred) != LULL_RECLAIM_WANTED) return 15;
    char *again = lull_malloc(40 * MiB);
    if (!again) return 11;
    if (thread_count() < 2) return 13;
    lull_free(again);
    if (!lull_reclaim_now()) return 14;
    return 0;
}

Test(fork, a_child_starts_its_reclaim_thread_once_it_frees_a_huge_block) {
    lull_set_purge_delay_ms(0);
    int r = in_child(child_frees_huge);
    cr_assert_eq(r, 0,
                 "child step %d failed (10: more than one thread after fork, 11: malloc failed, "
                 "12: a malloc started a thread, 13: no reclaim thread after the free and a "
                 "malloc, 14: lull_reclaim_now() false, 15: the free did not want the thread)",
                 r);
}
