/* The warm reserve prefaults clean slices with MADV_POPULATE_WRITE through
 * the purge backend (reclaim/warm_reserve.c). A kernel before 5.14 has no
 * MADV_POPULATE_WRITE (EINVAL): the slices go back to the free ones and
 * nothing is prefaulted, as docs/kernels.md says. Those refusals are not
 * purges the kernel failed: the counter page's purge_errors ("purge
 * operations the kernel failed") must not count them. It counted every
 * refused prefault range, tick after tick, with nothing purged at all.
 *
 * The older kernel is played by a seccomp filter in a new process of this
 * program (tests/support/reexec.h): madvise and process_madvise with
 * MADV_POPULATE_WRITE fail with EINVAL. backend=madvise, since an io_uring
 * request's madvise runs in the kernel, where no filter sees it. Refault
 * demand is faked as tests/test_purged_pages_prefault.c does; a day's purge
 * delay purges nothing. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/policy.h"
#include "reclaim/purge_backend.h"
#include "reclaim/refault.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif

/* the reclaim thread's backend (reclaim_thread.c), once it has opened it */
const purge_backend *lull_reclaim_backend(void);

/* the backend's runs so far: with nothing to purge, the reserve's
 * prefaults (which count in none of the counter page's purge figures) */
static uint64_t backend_runs(void) {
    const purge_backend *b = lull_reclaim_backend();
    return b ? purge_backend_counter(&b->runs) : 0;
}

#define ARG_LO(i) (offsetof(struct seccomp_data, args) + 8 * (i)) /* little endian */

/* madvise(.., .., POPULATE_WRITE) and process_madvise(.., .., .., POPULATE_WRITE):
 * EINVAL, every thread (the reclaim thread may not exist yet, or may). */
static int refuse_populate_write(void) {
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(2)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_POPULATE_WRITE, 4, 5),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW), /* (not reached) */
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_madvise, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG_LO(3)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, MADV_POPULATE_WRITE, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EINVAL),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    return (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog);
}

static void scenario(void) {
    if (refuse_populate_write() != 0) {
        printf("skip=1\n");
        fflush(stdout);
        _exit(0);
    }
    /* the filter works: a prefault of our own is refused */
    char *p = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED || madvise(p, 4096, MADV_POPULATE_WRITE) == 0) _exit(3);
    if (!lull_reclaim_now() || !lull_reclaim_now()) _exit(4);
    struct lull_counters c0, c1;
    if (lull_stats(&c0) != 0) _exit(5);
    uint64_t runs0 = backend_runs();
    /* 64 slices of demand, as the monitor or the accounting counts it */
    atomic_fetch_add(&lull_the_policy.refaulted_slices, 64);
    atomic_fetch_add(&lull_refault_pages_seen, 64 * 16);
    /* ticks that try to fill the reserve: each one's prefault is a run of
     * the backend (bounded by runs seen, not by time) */
    c1 = c0;
    for (int i = 0; i < 50 && backend_runs() < runs0 + 8; i++) {
        if (!lull_reclaim_now()) _exit(4);
        if (lull_stats(&c1) != 0) _exit(5);
    }
    printf("skip=0\n");
    printf("backend=%llu\n", (unsigned long long)c1.backend);
    printf("warm=%llu\n", (unsigned long long)c1.total.warm);
    printf("runs=%llu\n", (unsigned long long)(backend_runs() - runs0));
    printf("syscalls=%llu\n",
           (unsigned long long)(c1.purge_syscalls[LULL_COUNTERS_BACKEND_MADVISE] -
                                c0.purge_syscalls[LULL_COUNTERS_BACKEND_MADVISE]));
    printf("purged_pages=%llu\n", (unsigned long long)(c1.purged_pages - c0.purged_pages));
    printf("purge_errors=%llu\n", (unsigned long long)(c1.purge_errors - c0.purge_errors));
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor(200))) static void child(void) {
    if (getenv("LULL_TEST_PREFAULT_ERRORS")) scenario();
}

Test(prefault_errors, a_refused_prefault_is_no_purge_error, .timeout = 120) {
#if !defined(__x86_64__)
    cr_skip_test("the seccomp filter is written for x86-64");
#endif
    const char *vars[] = {"LULL_TEST_PREFAULT_ERRORS=1",
                          "LULL_CONF=backend=madvise,warm_reserve_mb=16,refault_monitor=off,"
                          "purge_delay_ms=86400000",
                          NULL};
    child_run cr;
    reexec_run("test_prefault_errors", vars, "refused prefaults", 60000, &cr);
    reexec_assert_exited_0(&cr, "refused prefaults");
    if (reexec_field(&cr, "skip")) cr_skip_test("seccomp unavailable here");
    cr_assert_eq(reexec_field(&cr, "backend"), LULL_COUNTERS_BACKEND_MADVISE);
    cr_assert_eq(reexec_field(&cr, "warm"), 0, "a refused prefault made slices warm");
    cr_assert_geq(reexec_field(&cr, "runs"), 8, "the reserve never tried to prefault");
    cr_assert_eq(reexec_field(&cr, "syscalls"), 0, "a refused prefault counted as a purge's call");
    cr_assert_eq(reexec_field(&cr, "purged_pages"), 0, "something was purged");
    cr_assert_eq(reexec_field(&cr, "purge_errors"), 0,
                 "nothing was purged, and purge_errors counted %llu refused prefaults",
                 (unsigned long long)reexec_field(&cr, "purge_errors"));
}
