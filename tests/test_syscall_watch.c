/* The syscall watcher itself: it records the watched calls of a watched
 * thread (synchronously, with the right number, tid and arguments), records
 * nothing for other threads, and never changes what a call does. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <linux/io_uring.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "support/syscall_watch.h"

#define PAGE 4096

static pid_t tid_now(void) {
    return (pid_t)syscall(SYS_gettid);
}

static void warm_up(void) {
    /* Let the allocator the test is linked with start whatever threads it
     * starts before anything is watched, so that they do not inherit a
     * filter. */
    free(malloc(64));
    cr_assert_eq(syscall_watch_start(), 0, "syscall_watch_start: %s", strerror(errno));
}

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Find the index of the first stored event of tid with number nr at or
 * after index from; -1 if none. Calls a sanitizer runtime made itself are
 * passed over (ThreadSanitizer's munmap interceptor unmaps shadow memory
 * with a munmap of its own before it calls the real munmap). */
static long find_event(const struct syscall_watch_event *ev, size_t n, size_t from, pid_t tid,
                       long nr) {
    for (size_t i = from; i < n; i++)
        if (ev[i].tid == tid && ev[i].nr == nr && !(ev[i].flags & SYSCALL_WATCH_RUNTIME))
            return (long)i;
    return -1;
}

static struct syscall_watch_event g_ev[4096];

/* ---- direct calls on a watched thread ----------------------------------- */

struct direct_result {
    int install_rc, install_errno;
    pid_t tid;
    char fail[256]; /* first failed check inside the thread, if any */
    void *madv_addr, *remap_old, *remap_new, *unmap_addr;
    size_t madv_len, remap_old_len, remap_new_len, unmap_len;
    int uring_fd, uring_errno;
    int pmadv_rc, pmadv_errno;
};

#define CHECK(r, cond, ...)                                                                        \
    do {                                                                                           \
        if (!(cond) && !(r)->fail[0]) snprintf((r)->fail, sizeof(r)->fail, __VA_ARGS__);           \
    } while (0)

static void *direct_calls(void *arg) {
    struct direct_result *r = arg;
    r->tid = tid_now();
    r->install_rc = syscall_watch_install_on_this_thread();
    r->install_errno = errno;
    if (r->install_rc != 0) return NULL;
    CHECK(r, syscall_watch_installed_here(), "installed_here() is 0");

    /* madvise(MADV_DONTNEED) is recorded before it returns, and it runs:
     * the private anonymous page reads back as zero. */
    size_t before = syscall_watch_count_tid(r->tid);
    r->madv_len = 4 * PAGE;
    unsigned char *m = map(r->madv_len);
    CHECK(r, m != NULL, "mmap failed");
    if (!m) return NULL;
    memset(m, 0xab, r->madv_len);
    r->madv_addr = m;
    int rc = madvise(m, r->madv_len, MADV_DONTNEED);
    CHECK(r, rc == 0, "madvise failed: %s", strerror(errno));
    CHECK(r, syscall_watch_count_tid(r->tid) == before + 1,
          "madvise not recorded synchronously: %zu -> %zu", before,
          syscall_watch_count_tid(r->tid));
    CHECK(r, m[0] == 0 && m[r->madv_len - 1] == 0, "MADV_DONTNEED did not take effect");

    /* mremap moves and grows; the data comes along. */
    r->remap_old_len = 2 * PAGE;
    r->remap_new_len = 64 * PAGE;
    unsigned char *a = map(r->remap_old_len);
    CHECK(r, a != NULL, "mmap failed");
    if (!a) return NULL;
    memset(a, 0x5a, r->remap_old_len);
    /* Block the address right after a, so the grow has to move. */
    void *blocker = mmap(a + r->remap_old_len, PAGE, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    unsigned char *b = mremap(a, r->remap_old_len, r->remap_new_len, MREMAP_MAYMOVE);
    CHECK(r, b != MAP_FAILED, "mremap failed: %s", strerror(errno));
    if (b == MAP_FAILED) return NULL;
    r->remap_old = a;
    r->remap_new = b;
    CHECK(r, b[0] == 0x5a && b[r->remap_old_len - 1] == 0x5a, "mremap lost the data");
    b[r->remap_new_len - 1] = 1;
    CHECK(r, syscall_watch_count_tid(r->tid) == before + 2, "mremap not recorded");

    /* munmap unmaps: msync and mincore on the range then fail with ENOMEM. */
    r->unmap_addr = b;
    r->unmap_len = r->remap_new_len;
    rc = munmap(b, r->remap_new_len);
    CHECK(r, rc == 0, "munmap failed: %s", strerror(errno));
    CHECK(r, syscall_watch_count_tid(r->tid) == before + 3, "munmap not recorded");
    errno = 0;
    rc = msync(b, PAGE, MS_ASYNC);
    CHECK(r, rc == -1 && errno == ENOMEM, "msync after munmap: rc %d errno %d", rc, errno);
    unsigned char vec[1];
    errno = 0;
    rc = mincore(b, PAGE, vec);
    CHECK(r, rc == -1 && errno == ENOMEM, "mincore after munmap: rc %d errno %d", rc, errno);
    if (blocker != MAP_FAILED) munmap(blocker, PAGE); /* one more munmap */

    /* io_uring_setup is recorded whether or not io_uring is available. */
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    errno = 0;
    r->uring_fd = (int)syscall(__NR_io_uring_setup, 4, &p);
    r->uring_errno = errno;
    if (r->uring_fd >= 0) {
        /* io_uring_enter with nothing to do, io_uring_register of nothing. */
        syscall(__NR_io_uring_enter, r->uring_fd, 0, 0, 0, NULL, 0);
        syscall(__NR_io_uring_register, r->uring_fd, IORING_UNREGISTER_BUFFERS, NULL, 0);
        close(r->uring_fd);
    }

    /* process_madvise on ourselves. */
    int pidfd = (int)syscall(SYS_pidfd_open, getpid(), 0);
    unsigned char *c = map(PAGE);
    struct iovec iov = {.iov_base = c, .iov_len = PAGE};
    errno = 0;
    r->pmadv_rc = (int)syscall(440 /* process_madvise */, pidfd, &iov, 1, MADV_COLD, 0);
    r->pmadv_errno = errno;
    if (pidfd >= 0) close(pidfd);
    return NULL;
}

Test(syscall_watch, records_each_watched_call_of_a_watched_thread) {
    warm_up();
    struct direct_result r;
    memset(&r, 0, sizeof r);
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, direct_calls, &r), 0);
    pthread_join(th, NULL);
    cr_assert_eq(r.install_rc, 0, "install: %s", strerror(r.install_errno));
    if (r.fail[0]) syscall_watch_dump(1);
    cr_assert_eq(r.fail[0], 0, "%s", r.fail);

    size_t n = syscall_watch_get(g_ev, 4096);
    long i = find_event(g_ev, n, 0, r.tid, SYS_madvise);
    cr_assert_geq(i, 0, "no madvise event");
    cr_expect_eq(g_ev[i].args[0], (uint64_t)(uintptr_t)r.madv_addr);
    cr_expect_eq(g_ev[i].args[1], r.madv_len);
    cr_expect_eq(g_ev[i].args[2], (uint64_t)MADV_DONTNEED);
    cr_expect_eq(g_ev[i].flags, 0u);

    long j = find_event(g_ev, n, (size_t)i + 1, r.tid, SYS_mremap);
    cr_assert_gt(j, i, "no mremap event after the madvise");
    cr_expect_eq(g_ev[j].args[0], (uint64_t)(uintptr_t)r.remap_old);
    cr_expect_eq(g_ev[j].args[1], r.remap_old_len);
    cr_expect_eq(g_ev[j].args[2], r.remap_new_len);

    long k = find_event(g_ev, n, (size_t)j + 1, r.tid, SYS_munmap);
    cr_assert_gt(k, j, "no munmap event after the mremap");
    cr_expect_eq(g_ev[k].args[0], (uint64_t)(uintptr_t)r.unmap_addr);
    cr_expect_eq(g_ev[k].args[1], r.unmap_len);

    long u = find_event(g_ev, n, (size_t)k + 1, r.tid, __NR_io_uring_setup);
    cr_assert_gt(u, k, "no io_uring_setup event (setup returned %d, errno %d)", r.uring_fd,
                 r.uring_errno);
    cr_expect_eq(g_ev[u].args[0], 4u);
    if (r.uring_fd >= 0) {
        cr_expect_gt(find_event(g_ev, n, (size_t)u + 1, r.tid, __NR_io_uring_enter), u);
        cr_expect_gt(find_event(g_ev, n, (size_t)u + 1, r.tid, __NR_io_uring_register), u);
    }
    cr_expect_gt(find_event(g_ev, n, (size_t)u + 1, r.tid, 440), u,
                 "no process_madvise event (rc %d errno %d)", r.pmadv_rc, r.pmadv_errno);

    for (size_t e = 0; e < n; e++) {
        cr_expect_eq(g_ev[e].seq, e);
        cr_expect(g_ev[e].tid == r.tid, "event from unexpected tid %d (%s)", (int)g_ev[e].tid,
                  syscall_watch_name(g_ev[e].nr));
    }
}

/* The direct syscall(2) path is recorded as well as the libc wrappers, and
 * an error return is passed through unchanged. */
static void *bad_calls(void *arg) {
    int *out = arg;
    out[0] = syscall_watch_install_on_this_thread();
    errno = 0;
    out[1] = (int)syscall(SYS_munmap, (void *)1, PAGE); /* misaligned: EINVAL */
    out[2] = errno;
    errno = 0;
    out[3] = madvise((void *)PAGE, PAGE, 12345); /* bad advice: EINVAL */
    out[4] = errno;
    out[5] = (int)tid_now();
    return NULL;
}

Test(syscall_watch, failing_calls_are_recorded_and_fail_as_usual) {
    warm_up();
    int out[6] = {0};
    pthread_t th;
    pthread_create(&th, NULL, bad_calls, out);
    pthread_join(th, NULL);
    cr_assert_eq(out[0], 0);
    cr_expect_eq(out[1], -1);
    cr_expect_eq(out[2], EINVAL);
    cr_expect_eq(out[3], -1);
    cr_expect_eq(out[4], EINVAL);
    cr_expect_eq(syscall_watch_count_tid(out[5]), 2u);
}

/* ---- threads that are not watched --------------------------------------- */

static pthread_barrier_t g_barrier;

static void *watched_idle(void *arg) {
    int *rc = arg;
    *rc = syscall_watch_install_on_this_thread();
    pthread_barrier_wait(&g_barrier); /* installed */
    pthread_barrier_wait(&g_barrier); /* the others are done */
    return NULL;
}

static void do_the_calls(void) {
    unsigned char *a = map(8 * PAGE);
    memset(a, 1, 8 * PAGE);
    madvise(a, 8 * PAGE, MADV_DONTNEED);
    unsigned char *b = mremap(a, 8 * PAGE, 32 * PAGE, MREMAP_MAYMOVE);
    munmap(b, 32 * PAGE);
    struct io_uring_params p;
    memset(&p, 0, sizeof p);
    int fd = (int)syscall(__NR_io_uring_setup, 2, &p);
    if (fd >= 0) close(fd);
}

static void *unwatched_calls(void *arg) {
    *(pid_t *)arg = tid_now();
    do_the_calls();
    return NULL;
}

Test(syscall_watch, records_nothing_for_unwatched_threads) {
    warm_up();
    cr_assert_eq(pthread_barrier_init(&g_barrier, NULL, 2), 0);
    int rc = -1;
    pthread_t w, u;
    pthread_create(&w, NULL, watched_idle, &rc);
    pthread_barrier_wait(&g_barrier);
    cr_assert_eq(rc, 0, "install failed");

    pid_t utid = 0;
    pthread_create(&u, NULL, unwatched_calls, &utid);
    pthread_join(u, NULL);
    do_the_calls(); /* the main thread is not watched either */
    cr_assert_eq(syscall_watch_sync(5000), 0);
    cr_expect_eq(syscall_watch_count_tid(utid), 0u);
    cr_expect_eq(syscall_watch_count_tid(tid_now()), 0u);
    if (syscall_watch_count() != 0) syscall_watch_dump(1);
    cr_expect_eq(syscall_watch_count(), 0u);

    pthread_barrier_wait(&g_barrier);
    pthread_join(w, NULL);
    pthread_barrier_destroy(&g_barrier);
}

/* ---- inheritance, thread exit, done ------------------------------------- */

static void *child_calls(void *arg) {
    *(pid_t *)arg = tid_now();
    unsigned char *a = map(PAGE);
    munmap(a, PAGE);
    return NULL;
}

static void *watched_parent(void *arg) {
    pid_t *tids = arg;
    tids[0] = tid_now();
    if (syscall_watch_install_on_this_thread() != 0) return NULL;
    /* A second install is a no-op. */
    if (syscall_watch_install_on_this_thread() != 0) return NULL;
    pthread_t c;
    pthread_create(&c, NULL, child_calls, &tids[1]);
    pthread_join(c, NULL);
    return NULL;
}

Test(syscall_watch, threads_created_by_a_watched_thread_are_watched) {
    warm_up();
    pid_t tids[2] = {0, 0};
    pthread_t th;
    pthread_create(&th, NULL, watched_parent, tids);
    pthread_join(th, NULL);
    cr_assert_neq(tids[1], 0);
    cr_assert_eq(syscall_watch_sync(5000), 0);
    size_t n = syscall_watch_get(g_ev, 4096);
    cr_expect_geq(find_event(g_ev, n, 0, tids[1], SYS_munmap), 0,
                  "the child's munmap was not recorded");
    /* The child's exit madvise (stack unknown to the watcher) may be
     * recorded; its munmap is there in any case. */
    cr_expect_geq(syscall_watch_count_tid(tids[1]), 1u);
}

static void *install_then_exit(void *arg) {
    pid_t *tid = arg;
    *tid = tid_now();
    if (syscall_watch_install_on_this_thread() != 0) *tid = -1;
    return NULL;
}

Test(syscall_watch, glibc_stack_madvise_at_thread_exit_is_exempt) {
    warm_up();
    pid_t tid = 0;
    pthread_t th;
    pthread_create(&th, NULL, install_then_exit, &tid);
    pthread_join(th, NULL);
    cr_assert_gt(tid, 0);
    cr_assert_eq(syscall_watch_sync(5000), 0);
    if (syscall_watch_count() != 0) syscall_watch_dump(1);
    cr_expect_eq(syscall_watch_count(), 0u, "the thread made no call of its own");
    /* glibc madvises the dead thread's stack (when it is big enough, as the
     * default 8 MiB one is): that call is recorded and flagged. */
    size_t n = syscall_watch_get(g_ev, 4096);
    bool own_stack = false;
    for (long i = find_event(g_ev, n, 0, tid, SYS_madvise); i >= 0 && !own_stack;
         i = find_event(g_ev, n, (size_t)i + 1, tid, SYS_madvise))
        own_stack = g_ev[i].flags & SYSCALL_WATCH_OWN_STACK;
    if (!own_stack) syscall_watch_dump(1);
    cr_expect(own_stack, "no exit madvise of the thread's own stack was recorded");
}

static void *done_then_call(void *arg) {
    pid_t *tid = arg;
    *tid = tid_now();
    if (syscall_watch_install_on_this_thread() != 0) {
        *tid = -1;
        return NULL;
    }
    unsigned char *a = map(PAGE);
    munmap(a, PAGE); /* counted */
    syscall_watch_thread_done();
    a = map(PAGE);
    munmap(a, PAGE); /* flagged AFTER_DONE */
    return NULL;
}

Test(syscall_watch, calls_after_thread_done_are_flagged) {
    warm_up();
    pid_t tid = 0;
    pthread_t th;
    pthread_create(&th, NULL, done_then_call, &tid);
    pthread_join(th, NULL);
    cr_assert_gt(tid, 0);
    cr_assert_eq(syscall_watch_sync(5000), 0);
    cr_expect_eq(syscall_watch_count_tid(tid), 1u);
    cr_expect_eq(syscall_watch_count(), 1u);
    size_t n = syscall_watch_get(g_ev, 4096);
    long i = find_event(g_ev, n, 0, tid, SYS_munmap);
    long j = find_event(g_ev, n, (size_t)i + 1, tid, SYS_munmap);
    cr_assert(i >= 0 && j > i);
    cr_expect_eq(g_ev[i].flags, 0u);
    cr_expect(g_ev[j].flags & SYSCALL_WATCH_AFTER_DONE);
    cr_expect_geq(syscall_watch_count_all(), 2u);
}

/* ---- many threads, listener reuse, reset -------------------------------- */

#define HAMMER_THREADS 8
#define HAMMER_CALLS 500

static void *hammer(void *arg) {
    pid_t *tid = arg;
    *tid = tid_now();
    if (syscall_watch_install_on_this_thread() != 0) {
        *tid = -1;
        return NULL;
    }
    unsigned char *a = map(PAGE);
    for (int i = 0; i < HAMMER_CALLS; i++) {
        a[0] = (unsigned char)i;
        madvise(a, PAGE, MADV_DONTNEED);
        if (a[0] != 0) {
            *tid = -2;
            break;
        }
    }
    munmap(a, PAGE);
    return NULL;
}

Test(syscall_watch, concurrent_watched_threads_are_all_recorded) {
    warm_up();
    pthread_t th[HAMMER_THREADS];
    pid_t tid[HAMMER_THREADS];
    for (int i = 0; i < HAMMER_THREADS; i++)
        pthread_create(&th[i], NULL, hammer, &tid[i]);
    for (int i = 0; i < HAMMER_THREADS; i++)
        pthread_join(th[i], NULL);
    cr_assert_eq(syscall_watch_sync(5000), 0);
    for (int i = 0; i < HAMMER_THREADS; i++) {
        cr_assert_gt(tid[i], 0, "thread %d failed (%d)", i, tid[i]);
        cr_expect_eq(syscall_watch_count_tid(tid[i]), (size_t)HAMMER_CALLS + 1);
    }
    cr_expect_eq(syscall_watch_count(), (size_t)HAMMER_THREADS * (HAMMER_CALLS + 1));
    syscall_watch_reset();
    cr_expect_eq(syscall_watch_count(), 0u);
    cr_expect_eq(syscall_watch_count_all(), 0u);
    cr_expect_eq(syscall_watch_get(g_ev, 4096), 0u);
}

static void *one_call(void *arg) {
    pid_t *tid = arg;
    *tid = tid_now();
    if (syscall_watch_install_on_this_thread() != 0) {
        *tid = -1;
        return NULL;
    }
    unsigned char *a = map(PAGE);
    munmap(a, PAGE);
    return NULL;
}

Test(syscall_watch, listeners_of_exited_threads_are_reused) {
    warm_up();
    /* More watched threads, one after another, than listener slots. */
    const int n = SYSCALL_WATCH_MAX_LISTENERS + 64;
    for (int i = 0; i < n; i++) {
        pid_t tid = 0;
        pthread_t th;
        cr_assert_eq(pthread_create(&th, NULL, one_call, &tid), 0);
        pthread_join(th, NULL);
        cr_assert_gt(tid, 0, "install failed for thread %d", i);
    }
    cr_assert_eq(syscall_watch_sync(5000), 0);
    cr_expect_eq(syscall_watch_count(), (size_t)n);
}

Test(syscall_watch, names) {
    cr_expect_str_eq(syscall_watch_name(SYS_madvise), "madvise");
    cr_expect_str_eq(syscall_watch_name(SYS_munmap), "munmap");
    cr_expect_str_eq(syscall_watch_name(SYS_mremap), "mremap");
    cr_expect_str_eq(syscall_watch_name(440), "process_madvise");
    cr_expect_str_eq(syscall_watch_name(__NR_io_uring_setup), "io_uring_setup");
    cr_expect_str_eq(syscall_watch_name(__NR_io_uring_enter), "io_uring_enter");
    cr_expect_str_eq(syscall_watch_name(__NR_io_uring_register), "io_uring_register");
    cr_expect_str_eq(syscall_watch_name(SYS_write), "syscall_1");
}
