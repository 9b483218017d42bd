/* Purge backend: process_madvise(2) on a pidfd of this process, one call per
 * batch of ranges. Any advice on one's own process needs kernel 6.13+
 * (earlier kernels allow only MADV_COLD/PAGEOUT/WILLNEED/COLLAPSE and answer
 * EINVAL), so the open probes it on a scratch page. */
#include "reclaim/purge_backend.h"
#include "base/fault.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_process_madvise
#define SYS_process_madvise 440
#endif

/* The kernel clamps an iovec total above MAX_RW_COUNT (INT_MAX rounded down
 * to a page) by shortening the iovecs: keep every batch below it. */
#define PM_MAX_BYTES ((size_t)0x7ffff000)

/* Bytes advised (iovecs are done whole and in order), or -errno. */
static long pm_call(purge_backend *b, const struct iovec *iov, size_t cnt, int advice) {
    purge_count_syscall(b, &b->per_kind[LULL_BACKEND_PROCESS_MADVISE].calls);
    if (lull_fault(LULL_FAULT_PROCESS_MADVISE)) return -EINVAL; /* as a kernel before 6.13 */
    if (lull_fault(LULL_FAULT_PURGE_NOMEM)) return -ENOMEM;     /* the kernel short of memory */
    long ret = syscall(SYS_process_madvise, b->pidfd, iov, cnt, advice, 0u);
    return ret < 0 ? -errno : ret;
}

int purge_pm_open(purge_backend *b, const purge_range *probe, const char **what) {
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0u);
    if (fd < 0) {
        *what = "pidfd_open";
        return -errno;
    }
    b->pidfd = fd;
    struct iovec v = {probe->addr, probe->len};
    long ret = pm_call(b, &v, 1, MADV_DONTNEED);
    if (ret != (long)probe->len) {
        purge_pm_close(b, true);
        *what = "process_madvise(self, MADV_DONTNEED)";
        return ret < 0 ? (int)ret : -EIO;
    }
    b->pm_ok = true;
    return 0;
}

LULL_FORK_EXEC_TEXT void purge_pm_close(purge_backend *b, bool fd_ok) { /* a fork child runs it */
    if (b->pidfd >= 0 && fd_ok) lull_close_unwrapped(b->pidfd);
    b->pidfd = -1;
    b->pm_ok = false;
}

size_t purge_pm_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res) {
    size_t ok = 0, i = 0;
    while (i < n) {
        if (!b->pm_ok) { /* given up earlier in this call */
            ok += purge_madvise_run(b, r + i, n - i, advice, res + i);
            break;
        }
        struct iovec iov[PURGE_RING_ENTRIES];
        size_t k = 0, bytes = 0;
        while (i + k < n && k < PURGE_RING_ENTRIES &&
               (k == 0 || bytes + r[i + k].len <= PM_MAX_BYTES)) {
            iov[k].iov_base = r[i + k].addr;
            iov[k].iov_len = r[i + k].len;
            bytes += r[i + k].len;
            k++;
        }
        long ret = pm_call(b, iov, k, advice);
        /* Whole iovecs up to the byte count returned are done. */
        size_t done = 0, acc = 0;
        while (ret > 0 && done < k && acc + iov[done].iov_len <= (size_t)ret) {
            acc += iov[done].iov_len;
            res[i + done] = 0;
            done++;
        }
        purge_count_done(b, LULL_BACKEND_PROCESS_MADVISE, done, acc);
        ok += done;
        i += done;
        if (done == k) continue;
        /* Range i stopped the batch. Redo it with madvise: that purges it if
         * process_madvise was at fault, and gives its own error if not. */
        int perr = ret < 0 ? (int)ret : -EIO;
        purge_count(&b->redone, 1);
        res[i] = purge_madvise_one(b, &r[i], advice);
        if (res[i] == 0) {
            ok++;
            if (purge_err_blames_mechanism(perr))
                purge_degrade(b, LULL_BACKEND_PROCESS_MADVISE, "process_madvise failed at run time",
                              -perr);
        }
        i++;
    }
    return ok;
}
