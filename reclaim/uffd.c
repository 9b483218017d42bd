/* Refault monitor primitives; see uffd.h. */
#define _GNU_SOURCE
#include "reclaim/uffd.h"
#include "base/fault.h"
#include "base/fork_exec.h"
#include "base/linux_compat.h"
#include "base/message.h"

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef __NR_userfaultfd
#define __NR_userfaultfd 323
#endif

/* What a scan counts as "touched again" in each mechanism. */
#define REFAULT_WP_CATEGORIES ((__u64)PAGE_IS_WRITTEN)
#define REFAULT_PRESENT_CATEGORIES ((__u64)(PAGE_IS_PRESENT | PAGE_IS_SWAPPED))

/* Also what a fork child runs (refault_monitor_close): in base/fork_exec.h's
 * group, closing through the system call. One store after each close:
 * where two were together, gcc merged them into one 8-byte store of a
 * constant it loads from .rodata, a page of the child's for nothing. */
LULL_FORK_EXEC_TEXT static void close_fd(int *fd) {
    if (*fd >= 0) lull_close_unwrapped(*fd);
    *fd = -1;
}

/* One PAGEMAP_SCAN ioctl; the result, or -errno. The fault point stands
 * for a kernel without the ioctl. */
static long pagemap_scan(int fd, struct pm_scan_arg *arg) {
    if (lull_fault(LULL_FAULT_PAGEMAP_SCAN)) return -EINVAL;
    long r;
    do
        r = ioctl(fd, PAGEMAP_SCAN, arg);
    while (r < 0 && errno == EINTR);
    return r < 0 ? -errno : r;
}

static void scan_arg(struct pm_scan_arg *a, uintptr_t start, uintptr_t end, __u64 flags) {
    memset(a, 0, sizeof *a);
    a->size = sizeof *a;
    a->flags = flags;
    a->start = start;
    a->end = end;
}

/* /proc/self/pagemap, and whether it answers PAGEMAP_SCAN (6.7+; on older
 * kernels the ioctl is ENOTTY). Probed on one page of this stack. */
static int open_pagemap(const char **why) {
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        *why = "/proc/self/pagemap cannot be opened";
        return -1;
    }
    uintptr_t here = (uintptr_t)&fd & ~(uintptr_t)(sysconf(_SC_PAGESIZE) - 1);
    struct page_region v[1];
    struct pm_scan_arg a;
    scan_arg(&a, here, here + (uintptr_t)sysconf(_SC_PAGESIZE), 0);
    a.vec = (uintptr_t)v;
    a.vec_len = 1;
    a.category_anyof_mask = PAGE_IS_PRESENT;
    a.return_mask = PAGE_IS_PRESENT;
    long r = pagemap_scan(fd, &a);
    if (r != 1) {
        *why = "no PAGEMAP_SCAN ioctl (kernel before 6.7)";
        close(fd);
        return -1;
    }
    return fd;
}

/* A userfaultfd for this process, least privileged way first. */
static int create_uffd(bool *from_dev, const char **why) {
    const int flags = O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY;
    int fd;
    *from_dev = false;
    if (lull_fault(LULL_FAULT_UFFD)) {
        fd = -1;
        errno = EPERM;
    } else {
        fd = (int)syscall(__NR_userfaultfd, flags);
    }
    if (fd >= 0) return fd;
    int err = errno;

    int dev = open("/dev/userfaultfd", O_RDWR | O_CLOEXEC);
    if (dev >= 0) {
        if (lull_fault(LULL_FAULT_UFFD)) {
            fd = -1;
            errno = EPERM;
        } else {
            fd = ioctl(dev, USERFAULTFD_IOC_NEW, flags);
        }
        close(dev);
        if (fd >= 0) {
            *from_dev = true;
            return fd;
        }
    }
    *why = err == ENOSYS ? "userfaultfd not built into the kernel"
                         : "userfaultfd not permitted (syscall and /dev/userfaultfd)";
    return -1;
}

/* Prove the WP_ASYNC mechanism on a scratch mapping of two pages: register,
 * protect both (unpopulated: needs WP_UNPOPULATED), write the first one
 * from the kernel (clock_gettime through syscall(2) copies into it: were
 * the protection synchronous, USER_MODE_ONLY turns that into EFAULT instead
 * of a hang), then scan: exactly the first page must read as written. */
static bool wp_async_self_test(int uffd, int pagemap, size_t ps) {
    char *p = mmap(NULL, 2 * ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return false;
    bool ok = false;
    struct uffdio_register reg = {.range = {(uintptr_t)p, 2 * ps}, .mode = UFFDIO_REGISTER_MODE_WP};
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)p, 2 * ps},
                                     .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    if (ioctl(uffd, UFFDIO_REGISTER, &reg) == 0 &&
        (reg.ioctls & ((__u64)1 << _UFFDIO_WRITEPROTECT)) &&
        ioctl(uffd, UFFDIO_WRITEPROTECT, &wp) == 0 &&
        syscall(SYS_clock_gettime, CLOCK_MONOTONIC, (struct timespec *)p) == 0) {
        struct page_region v[2];
        struct pm_scan_arg a;
        scan_arg(&a, (uintptr_t)p, (uintptr_t)p + 2 * ps, PM_SCAN_CHECK_WPASYNC);
        a.vec = (uintptr_t)v;
        a.vec_len = 2;
        a.category_anyof_mask = REFAULT_WP_CATEGORIES;
        a.return_mask = REFAULT_WP_CATEGORIES;
        long r = pagemap_scan(pagemap, &a);
        ok = r == 1 && v[0].start == (uintptr_t)p && v[0].end == (uintptr_t)p + ps;
    }
    munmap(p, 2 * ps); /* drops the registration with the mapping */
    return ok;
}

refault_mechanism refault_monitor_open_at_most(refault_monitor *m, refault_mechanism best) {
    memset(m, 0, sizeof *m);
    m->uffd = -1;
    m->pagemap = -1;
    m->pid = getpid();
    m->best_allowed = best;
    m->page_size = (size_t)sysconf(_SC_PAGESIZE);
    m->reason = "";
    if (best == REFAULT_OFF) {
        m->kind = REFAULT_OFF;
        m->reason = "refault monitor off by configuration";
        return m->kind;
    }

    const char *why = "accounting chosen by configuration";
    if (best <= REFAULT_PRESENT_SCAN) m->pagemap = open_pagemap(&why);
    if (m->pagemap < 0) {
        m->kind = REFAULT_ACCOUNTING;
        m->reason = why;
        lull_verbose("refault monitor: accounting (%s)", why);
        return m->kind;
    }

    why = "present_scan chosen by configuration";
    if (best == REFAULT_WP_ASYNC) m->uffd = create_uffd(&m->uffd_from_dev, &why);
    if (m->uffd >= 0) {
        struct uffdio_api api = {.api = UFFD_API,
                                 .features = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED};
        const __u64 need = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
        if (ioctl(m->uffd, UFFDIO_API, &api) != 0) {
            why = "userfaultfd without WP_ASYNC / WP_UNPOPULATED (kernel before 6.7)";
            close_fd(&m->uffd);
        } else if ((api.features & need) != need) {
            why = "userfaultfd without WP_ASYNC / WP_UNPOPULATED (kernel before 6.7)";
            close_fd(&m->uffd);
        } else if (!wp_async_self_test(m->uffd, m->pagemap, m->page_size)) {
            why = "userfaultfd write-protect self-test failed";
            close_fd(&m->uffd);
        } else {
            m->uffd_features = api.features;
        }
    }

    if (m->uffd >= 0) {
        m->kind = REFAULT_WP_ASYNC;
        lull_verbose("refault monitor: wp_async (userfaultfd from %s)",
                     m->uffd_from_dev ? "/dev/userfaultfd" : "userfaultfd(2)");
    } else {
        m->kind = REFAULT_PRESENT_SCAN;
        m->reason = why;
        lull_verbose("refault monitor: present_scan (%s)", why);
    }
    return m->kind;
}

refault_mechanism refault_monitor_open(refault_monitor *m, bool want_off) {
    return refault_monitor_open_at_most(m, want_off ? REFAULT_OFF : REFAULT_WP_ASYNC);
}

static bool range_ok(const refault_monitor *m, const void *addr, size_t len) {
    uintptr_t mask = (uintptr_t)m->page_size - 1;
    return ((uintptr_t)addr & mask) == 0 && (len & mask) == 0 && len > 0 &&
           (uintptr_t)addr + len > (uintptr_t)addr;
}

int refault_register(refault_monitor *m, void *addr, size_t len) {
    if (m->kind != REFAULT_WP_ASYNC) return 0;
    if (m->pid != getpid()) return -ECHILD;
    if (!range_ok(m, addr, len)) return -EINVAL;
    struct uffdio_register reg = {.range = {(uintptr_t)addr, len}, .mode = UFFDIO_REGISTER_MODE_WP};
    if (ioctl(m->uffd, UFFDIO_REGISTER, &reg) != 0) return -errno;
    m->registered_bytes += len;
    return 0;
}

int refault_arm(refault_monitor *m, void *addr, size_t len) {
    if (m->kind != REFAULT_WP_ASYNC) return 0;
    if (m->pid != getpid()) return -ECHILD;
    if (!range_ok(m, addr, len)) return -EINVAL;
    /* UFFDIO_WRITEPROTECT or PAGEMAP_SCAN + PM_SCAN_WP_MATCHING: both end in
     * change_protection() placing WP_UNPOPULATED markers, both hold the
     * mmap_lock (read) for the call, and they cost the same within the
     * noise of bench/uffd_mmap_lock.c (one purged chunk on 6.18, 4 KiB
     * pages: 2 MiB 10-140 us vs 14-255 us, 16 MiB 67-820 us vs 62-1500 us;
     * UFFDIO_WRITEPROTECT ahead in most runs). UFFDIO_WRITEPROTECT also
     * needs no pagemap descriptor, so it is the one used. */
    struct uffdio_writeprotect wp = {.range = {(uintptr_t)addr, len},
                                     .mode = UFFDIO_WRITEPROTECT_MODE_WP};
    int r;
    do
        r = ioctl(m->uffd, UFFDIO_WRITEPROTECT, &wp);
    while (r != 0 && (errno == EINTR || errno == EAGAIN));
    if (r != 0) return -errno;
    m->armed_bytes += len;
    return 0;
}

long refault_scan(refault_monitor *m, void *addr, size_t len, struct page_region *out, size_t max,
                  bool rearm, size_t *pages_out) {
    if (pages_out) *pages_out = 0;
    m->scan_end = (uintptr_t)addr;
    if (m->kind != REFAULT_WP_ASYNC && m->kind != REFAULT_PRESENT_SCAN) return -EOPNOTSUPP;
    if (m->pid != getpid()) return -ECHILD;
    if (!range_ok(m, addr, len) || out == NULL || max == 0) return -EINVAL;

    struct pm_scan_arg a;
    if (m->kind == REFAULT_WP_ASYNC) {
        /* CHECK_WPASYNC: fail (EPERM) rather than report an unregistered
         * range, where every page reads as written. */
        __u64 flags = PM_SCAN_CHECK_WPASYNC | (rearm ? PM_SCAN_WP_MATCHING : 0);
        scan_arg(&a, (uintptr_t)addr, (uintptr_t)addr + len, flags);
        a.category_anyof_mask = REFAULT_WP_CATEGORIES;
        a.return_mask = REFAULT_WP_CATEGORIES;
    } else {
        scan_arg(&a, (uintptr_t)addr, (uintptr_t)addr + len, 0);
        a.category_anyof_mask = REFAULT_PRESENT_CATEGORIES;
        /* a read fault may map the shared zero page: not a refault */
        a.category_inverted = PAGE_IS_PFNZERO;
        a.category_mask = PAGE_IS_PFNZERO;
        a.return_mask = REFAULT_PRESENT_CATEGORIES;
    }
    a.vec = (uintptr_t)out;
    a.vec_len = max;
    long n = pagemap_scan(m->pagemap, &a);
    if (n < 0) return n;
    m->scan_end = (uintptr_t)a.walk_end;
    size_t pages = 0;
    for (long i = 0; i < n; i++)
        pages += (size_t)(out[i].end - out[i].start) / m->page_size;
    if (pages_out) *pages_out = pages;
    m->scans++;
    m->scanned_bytes += a.walk_end - a.start;
    m->written_pages += pages;
    return n;
}

const char *refault_mechanism_name(refault_mechanism k) {
    switch (k) {
    case REFAULT_WP_ASYNC:
        return "wp_async";
    case REFAULT_PRESENT_SCAN:
        return "present_scan";
    case REFAULT_ACCOUNTING:
        return "accounting";
    case REFAULT_OFF:
        return "off";
    }
    return "?";
}

/* Also what a fork child runs (lull_refault_after_fork_child): in
 * base/fork_exec.h's group. */
LULL_FORK_EXEC_TEXT void refault_monitor_close(refault_monitor *m) {
    close_fd(&m->uffd);
    close_fd(&m->pagemap);
    m->kind = REFAULT_OFF;
    m->reason = "refault monitor closed";
}

void refault_monitor_lost(refault_monitor *m, const char *why) {
    close_fd(&m->uffd);
    close_fd(&m->pagemap);
    m->reason = why;
    __atomic_store_n(&m->kind, REFAULT_ACCOUNTING, __ATOMIC_RELAXED);
}

bool refault_monitor_after_fork_child(refault_monitor *m) {
    refault_mechanism best = m->kind == REFAULT_OFF ? REFAULT_OFF : m->best_allowed;
    /* The child's copies of the parent's descriptors: closing them only
     * drops the child's references. */
    close_fd(&m->uffd);
    close_fd(&m->pagemap);
    refault_monitor_open_at_most(m, best);
    return m->kind == REFAULT_WP_ASYNC;
}
