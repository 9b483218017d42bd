/* Kernel check: request threads make no purge system call (group
 * "kernel"), the core of tests/test_no_purge_syscalls.c on this kernel.
 *
 *   kernel_no_purge_syscalls
 *       Two request threads, each with a seccomp filter of its own (no
 *       TSYNC: the reclaim thread, started before, is not filtered) that
 *       traps madvise(MADV_DONTNEED) and madvise(MADV_FREE), munmap,
 *       mremap, process_madvise and io_uring_enter (SECCOMP_RET_TRAP: the
 *       call never runs; the SIGSYS handler records it and makes it fail
 *       with EPERM). First the counter-test: a filtered thread's own
 *       madvise(MADV_DONTNEED) on a lull block is caught, and its
 *       madvise(MADV_WILLNEED) is not. Then the workload, with the purge
 *       delay 0 so that the reclaim thread purges while the threads run:
 *       bulk frees of 32 MiB in 64 KiB blocks, a huge block of 24 MiB, a
 *       realloc grown to 24 MiB, small and large blocks, two rounds each;
 *       every block's content checked before it is freed. No call may be
 *       trapped, the reclaim thread must have purged during the workload,
 *       and after two more ticks the freed memory is purged.
 *
 * The threads make no munmap of their own, so any munmap they make is
 * lull's. They never exit (glibc's thread exit madvises the thread's own
 * stack with MADV_DONTNEED): the sub-process ends with _exit. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#define GUEST_GROUP "kernel"
#include "guest.h"
#include "guest_lull.h"

#include "lull.h"
#include "lull/counters.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <ucontext.h>
#include <unistd.h>

#ifndef __x86_64__
#error "check_kernel_syscalls: the filter is written for x86-64"
#endif

#define NR_MUNMAP 11
#define NR_MREMAP 25
#define NR_MADVISE 28
#define NR_IO_URING_ENTER 426
#define NR_PROCESS_MADVISE 440

/* ---- what the filter caught ---- */

#define MAX_EVENTS 16
struct trapped {
    long nr;
    uint64_t arg[3];
    pid_t tid;
};
static struct trapped events[MAX_EVENTS];
static int n_events; /* atomic */

static void on_sigsys(int sig, siginfo_t *si, void *ucp) {
    (void)sig;
    ucontext_t *uc = ucp;
    int i = __atomic_fetch_add(&n_events, 1, __ATOMIC_RELAXED);
    if (i < MAX_EVENTS) {
        events[i].nr = si->si_syscall;
        events[i].arg[0] = (uint64_t)uc->uc_mcontext.gregs[REG_RDI];
        events[i].arg[1] = (uint64_t)uc->uc_mcontext.gregs[REG_RSI];
        events[i].arg[2] = (uint64_t)uc->uc_mcontext.gregs[REG_RDX];
        events[i].tid = (pid_t)syscall(SYS_gettid);
    }
    uc->uc_mcontext.gregs[REG_RAX] = -EPERM; /* the refused call fails */
}

static const char *nr_name(long nr) {
    switch (nr) {
    case NR_MUNMAP:
        return "munmap";
    case NR_MREMAP:
        return "mremap";
    case NR_MADVISE:
        return "madvise";
    case NR_IO_URING_ENTER:
        return "io_uring_enter";
    case NR_PROCESS_MADVISE:
        return "process_madvise";
    }
    return "?";
}

static void events_text(char *buf, size_t len) {
    int n = __atomic_load_n(&n_events, __ATOMIC_RELAXED);
    size_t at = (size_t)snprintf(buf, len, "%d trapped:", n);
    for (int i = 0; i < n && i < MAX_EVENTS && at < len; i++)
        at += (size_t)snprintf(buf + at, len - at, " tid %d %s(%#llx, %llu, %llu)", events[i].tid,
                               nr_name(events[i].nr), (unsigned long long)events[i].arg[0],
                               (unsigned long long)events[i].arg[1],
                               (unsigned long long)events[i].arg[2]);
}

/* ---- the filter ---- */

/* On the calling thread only. 0 or -errno. */
static int install_filter(void) {
    const uint32_t advice = offsetof(struct seccomp_data, args[2]); /* low word (little endian) */
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP), /* another ABI: refuse */
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_MUNMAP, 8, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_MREMAP, 7, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_PROCESS_MADVISE, 6, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_IO_URING_ENTER, 5, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NR_MADVISE, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, advice),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_DONTNEED, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_FREE, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_TRAP),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -errno;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) != 0) return -errno;
    return 0;
}

/* ---- request threads ---- */

struct request {
    unsigned seed;
    int install; /* 0 or -errno */
    bool content_ok, malloc_ok;
    int done; /* atomic */
};

static void fill(void *p, size_t n, unsigned seed) {
    unsigned char *c = p;
    for (size_t i = 0; i < n; i += GUEST_PAGE)
        c[i] = (unsigned char)(seed + i / GUEST_PAGE);
    c[n - 1] = (unsigned char)seed;
}

static bool intact(const void *p, size_t n, unsigned seed) {
    const unsigned char *c = p;
    for (size_t i = 0; i < n; i += GUEST_PAGE)
        if (c[i] != (unsigned char)(seed + i / GUEST_PAGE)) return false;
    return c[n - 1] == (unsigned char)seed;
}

#define BULK 512 /* x 64 KiB = 32 MiB */

static void workload(struct request *r) {
    static __thread void *bulk[BULK];
    static __thread void *mixed[1000];
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < BULK; i++) {
            bulk[i] = malloc(64 * KIB);
            if (!bulk[i]) {
                r->malloc_ok = false;
                return;
            }
            fill(bulk[i], 64 * KIB, r->seed + (unsigned)i);
        }
        for (int i = 0; i < BULK; i++) {
            if (!intact(bulk[i], 64 * KIB, r->seed + (unsigned)i)) r->content_ok = false;
            free(bulk[i]);
        }
        char *huge = malloc(24 * MIB);
        if (!huge) {
            r->malloc_ok = false;
            return;
        }
        fill(huge, 24 * MIB, r->seed);
        if (!intact(huge, 24 * MIB, r->seed)) r->content_ok = false;
        free(huge);
        char *g = malloc(100);
        if (g) fill(g, 100, 7);
        for (size_t n = 1000; g && n <= 24 * MIB; n *= 4) {
            char *q = realloc(g, n);
            if (!q) break;
            if (!intact(q, 100, 7)) r->content_ok = false;
            g = q;
            fill(g, n, 7);
            fill(g, 100, 7);
        }
        free(g);
        for (int i = 0; i < 1000; i++) {
            size_t n = i % 10 == 0 ? (size_t)(600 + i) * KIB : (size_t)(i * 37 % 3000 + 1);
            mixed[i] = malloc(n);
            if (mixed[i]) fill(mixed[i], n, (unsigned)i);
        }
        for (int i = 0; i < 1000; i++)
            free(mixed[i]);
        usleep(150 * 1000); /* the reclaim thread purges now */
    }
}

static void *request_main(void *arg) {
    struct request *r = arg;
    r->install = install_filter();
    if (r->install == 0) workload(r);
    __atomic_store_n(&r->done, 1, __ATOMIC_RELEASE);
    for (;;) /* never exits: see the top of the file */
        pause();
    return NULL;
}

struct counter_test {
    int install;
    int dontneed_rc, dontneed_errno, willneed_rc;
    int trapped_after_dontneed, trapped_after_willneed;
    bool intact;
    int done;
};

static void *counter_main(void *arg) {
    struct counter_test *t = arg;
    char *p = malloc(256 * KIB);
    if (p) fill(p, 256 * KIB, 3);
    t->install = install_filter();
    if (t->install == 0 && p) {
        char *page = (char *)(((uintptr_t)p + GUEST_PAGE - 1) & ~(uintptr_t)(GUEST_PAGE - 1));
        t->dontneed_rc = madvise(page, GUEST_PAGE, MADV_DONTNEED);
        t->dontneed_errno = errno;
        t->trapped_after_dontneed = __atomic_load_n(&n_events, __ATOMIC_RELAXED);
        t->willneed_rc = madvise(page, GUEST_PAGE, MADV_WILLNEED);
        t->trapped_after_willneed = __atomic_load_n(&n_events, __ATOMIC_RELAXED);
        t->intact = intact(p, 256 * KIB, 3); /* the refused DONTNEED never ran */
    }
    __atomic_store_n(&t->done, 1, __ATOMIC_RELEASE);
    for (;;)
        pause();
    return NULL;
}

static bool wait_done(int *flag, int seconds) {
    for (int i = 0; i < seconds * 100; i++) {
        if (__atomic_load_n(flag, __ATOMIC_ACQUIRE)) return true;
        usleep(10 * 1000);
    }
    return false;
}

static int sub_no_purge_syscalls(void) {
    if (!guest_lull_ours()) return GUEST_FAIL;
    struct kernel_features k;
    kernel_features_probe(&k);
    if (k.seccomp_trap != 0) {
        guest_sub_detail("no seccomp filters with SECCOMP_RET_TRAP on this kernel (%s)",
                         kernel_answer(k.seccomp_trap));
        return GUEST_SKIP;
    }
    /* the reclaim thread exists before any filter: it must not inherit one */
    GUEST_SUB_REQUIRE(lull_reclaim_now(), "the reclaim thread is not running");
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigsys;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    GUEST_SUB_REQUIRE(sigaction(SIGSYS, &sa, NULL) == 0, "sigaction(SIGSYS)");
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);

    /* the counter-test: a purge on a filtered thread is caught */
    static struct counter_test ct;
    pthread_t t;
    GUEST_SUB_REQUIRE(pthread_create(&t, &attr, counter_main, &ct) == 0, "pthread_create");
    GUEST_SUB_REQUIRE(wait_done(&ct.done, 30), "the counter-test thread did not finish");
    GUEST_SUB_REQUIRE(ct.install == 0, "seccomp filter: %s", kernel_answer(ct.install));
    GUEST_SUB_REQUIRE(ct.trapped_after_dontneed == 1 && ct.dontneed_rc == -1 &&
                          ct.dontneed_errno == EPERM,
                      "the filter missed a madvise(MADV_DONTNEED): %d trapped, rc %d errno %d",
                      ct.trapped_after_dontneed, ct.dontneed_rc, ct.dontneed_errno);
    GUEST_SUB_REQUIRE(ct.trapped_after_willneed == 1 && ct.willneed_rc == 0,
                      "the filter caught madvise(MADV_WILLNEED) (rc %d)", ct.willneed_rc);
    GUEST_SUB_REQUIRE(ct.intact, "the refused MADV_DONTNEED changed the block");
    __atomic_store_n(&n_events, 0, __ATOMIC_RELAXED);

    lull_set_purge_delay_ms(0);
    struct lull_counters c0, c1, c2;
    GUEST_SUB_REQUIRE(stats_now(&c0), "lull_stats failed");
    static struct request rq[2] = {{11, 0, true, true, 0}, {97, 0, true, true, 0}};
    for (int i = 0; i < 2; i++)
        GUEST_SUB_REQUIRE(pthread_create(&t, &attr, request_main, &rq[i]) == 0, "pthread_create");
    for (int i = 0; i < 2; i++)
        GUEST_SUB_REQUIRE(wait_done(&rq[i].done, 150), "request thread %d did not finish", i);
    GUEST_SUB_REQUIRE(stats_now(&c1), "lull_stats failed");
    for (int i = 0; i < 2; i++) {
        GUEST_SUB_REQUIRE(rq[i].install == 0, "seccomp filter on request thread %d: %s", i,
                          kernel_answer(rq[i].install));
        GUEST_SUB_REQUIRE(rq[i].malloc_ok, "malloc failed on request thread %d", i);
        GUEST_SUB_REQUIRE(rq[i].content_ok, "a block's content changed under request thread %d", i);
    }
    char ev[1024];
    events_text(ev, sizeof ev);
    GUEST_SUB_REQUIRE(__atomic_load_n(&n_events, __ATOMIC_RELAXED) == 0,
                      "purge system calls on request threads: %s", ev);
    uint64_t during = (c1.purged_pages - c0.purged_pages) * GUEST_PAGE;
    GUEST_SUB_REQUIRE(during > 0, "the reclaim thread purged nothing while the threads ran");
    lull_reclaim_now();
    lull_reclaim_now();
    GUEST_SUB_REQUIRE(stats_now(&c2), "lull_stats failed");
    uint64_t total = (c2.purged_pages - c0.purged_pages) * GUEST_PAGE;
    GUEST_SUB_REQUIRE(total >= (uint64_t)2 * BULK * 64 * KIB,
                      "only %llu KiB purged after the workload", (unsigned long long)(total / KIB));
    char purges[256];
    stats_purges_text(&c0, &c2, purges, sizeof purges);
    guest_sub_detail("seccomp filter (RET_TRAP) on 2 request threads: 0 madvise(DONTNEED/FREE), "
                     "munmap, mremap, process_madvise or io_uring_enter (counter-test caught 1); "
                     "the reclaim thread purged %llu KiB during the workload, %llu KiB in all, "
                     "unmapped %llu huge blocks (backend %s: %s); dirty %llu KiB",
                     (unsigned long long)(during / KIB), (unsigned long long)(total / KIB),
                     (unsigned long long)(c2.huge_unmapped - c0.huge_unmapped),
                     lull_counters_backend_name(c2.backend), purges,
                     (unsigned long long)(c2.total.dirty / KIB));
    return GUEST_PASS;
}
GUEST_SUB("kernel_no_purge_syscalls", sub_no_purge_syscalls);

GUEST_CHECK_TIMEOUT(kernel_no_purge_syscalls, 240) {
    return guest_lull_sub("kernel_no_purge_syscalls", "counter_page=off", NULL);
}

#endif /* LULL_GUEST_NO_LIB */
