/* Refault monitor: which purged pages came back.
 *
 * The reclaim thread purges free slices (MADV_DONTNEED / MADV_FREE) and
 * wants to know how many of them the program touched again soon after, to
 * steer the purge delay. These are the kernel primitives for that; the
 * reclaim thread drives them (there is no thread here), and nothing in this
 * file ever runs on a request thread. Nothing allocates: the monitor is a
 * fixed-size struct owned by the caller, scan results go into the caller's
 * array.
 *
 * Mechanisms, best first:
 *
 *   REFAULT_WP_ASYNC      userfaultfd write-protect mode with
 *                         UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED
 *                         (6.7+), read back with the PAGEMAP_SCAN ioctl
 *                         (PAGE_IS_WRITTEN). Counts writes only.
 *   REFAULT_PRESENT_SCAN  no usable userfaultfd, but PAGEMAP_SCAN works:
 *                         a purged page that is present (or swapped) again
 *                         was touched again (PAGE_IS_PRESENT, zero-page
 *                         mappings excluded). Nothing to register or arm.
 *                         Same answer as WP_ASYNC on 4 KiB pages (tested);
 *                         on THP memory a write into a purged 2 MiB extent
 *                         brings the whole extent back and the scan reports
 *                         all 512 pages: the memory that came back, not the
 *                         pages written. Reads count too where the kernel
 *                         does not map the zero page for them.
 *   REFAULT_ACCOUNTING    no PAGEMAP_SCAN (Linux 6.1): the allocator counts
 *                         reuse of purged slices itself; every call here is a
 *                         no-op and refault_scan() says -EOPNOTSUPP. Also
 *                         where a better mechanism stops working at run
 *                         time (refault_monitor_lost).
 *   REFAULT_OFF           switched off by configuration.
 *
 * The userfaultfd is created least-privileged first: userfaultfd(2) with
 * UFFD_USER_MODE_ONLY (allowed to everyone even with
 * vm.unprivileged_userfaultfd=0), then /dev/userfaultfd +
 * USERFAULTFD_IOC_NEW (file permissions decide). Only WP_ASYNC and
 * WP_UNPOPULATED are requested: never MISSING mode (a faulting thread would
 * wait for a handler), never EVENT_REMOVE (madvise would wait for the
 * monitor: deadlock when the monitor is the purging thread), never
 * EVENT_FORK. refault_monitor_open() proves the mechanism with a self-test
 * on a scratch page before choosing it, written through a system call so a
 * wrong feature set would fail with EFAULT instead of hanging.
 *
 * Verified on kernel 6.18 (features 0x1ffff) by tests/test_uffd.c:
 *  - UFFDIO_REGISTER_MODE_WP works on anonymous private mappings. A
 *    registration only marks the VMA: no page is protected until armed, and
 *    an unprotected page (present or not) reads as PAGE_IS_WRITTEN. So a
 *    scan only means something over ranges that were armed.
 *  - Registering a whole segment costs ~5-45 us whatever its size (one VMA
 *    flag change; adjacent registered segments merge into one VMA).
 *    Registering part of a VMA splits it: register whole segments, once,
 *    before publishing them (vm.max_map_count is 65530).
 *  - WP_UNPOPULATED: arming an unpopulated (purged) range installs uffd-wp
 *    PTE markers, so the next fault on it is tracked; without it a purged
 *    page would read as written at once.
 *  - WP_ASYNC: a write to a protected page is resolved by the kernel inside
 *    the fault, with nobody reading the uffd: the faulting thread never
 *    waits for another thread (test "writer_never_blocks"). Writes from
 *    kernel mode (read(2) into the page, copy_to_user) are resolved the same
 *    way and counted, even with UFFD_USER_MODE_ONLY.
 *  - MADV_DONTNEED drops the markers of the range: a purged range reads as
 *    written until refault_arm() protects it again. Re-arming works as
 *    often as wanted (UFFDIO_WRITEPROTECT or PAGEMAP_SCAN with
 *    PM_SCAN_WP_MATCHING; see refault_arm for which is used).
 *  - A read of an armed unpopulated page is not reported as written (this
 *    kernel gives anonymous read faults a real page, not the zero page).
 *  - THP: a registered VMA still gets huge pages on first touch, but arming
 *    a purged range installs PTE-level markers (a page table per 2 MiB), so
 *    the refault of an armed range is served with 4 KiB pages, and a write
 *    to a protected huge page splits its PMD. Arming costs the THP benefit
 *    on exactly the ranges it watches.
 *  - The price of registering (bench/uffd_mmap_lock.c): on 6.18
 *    MADV_DONTNEED on a registered VMA takes the process-wide mmap_lock
 *    (read) instead of the per-VMA lock, and so do UFFDIO_WRITEPROTECT and
 *    PAGEMAP_SCAN (for their whole walk). Another thread's mmap/munmap
 *    (mmap_lock write) then sleeps until the call ends, and longer when the
 *    holder is preempted: measured, a thread doing mmap+touch+munmap of
 *    64 KiB never blocked while a 1 GiB region was purged unregistered, and
 *    blocked up to 10-265 ms per call once it was registered (2 vCPUs,
 *    heavily loaded). Faults on a registered VMA, WP_ASYNC write faults
 *    included, stay under the per-VMA lock and block nobody. So with
 *    WP_ASYNC every purge of the reclaim thread can stall request threads
 *    that map or unmap, which PRESENT_SCAN (no registration) avoids; keep
 *    purge, arm and scan calls short (2-16 MiB, scans <= 64 MiB).
 *  - Arming present memory is slow (UFFDIO_WRITEPROTECT of 1 GiB of
 *    populated 4 KiB pages ~20-130 ms, a scan with rearm ~25-125 ms);
 *    arming purged holes ~2-20 ms per GiB; a scan that changes nothing
 *    ~1-5 ms per GiB of 4 KiB page tables, ~20-80 us per GiB of THP.
 *    Measured under heavy load: take the low ends.
 *
 * Fork: a child gets no userfaultfd context (no EVENT_FORK): its copies of
 * the registered VMAs are plain VMAs with no markers, so nothing of the
 * parent's monitor affects the child's memory. But the inherited file
 * descriptors still point at the PARENT: the uffd's context is the parent's
 * mm (UFFDIO_WRITEPROTECT through it changes the parent; UFFDIO_REGISTER of
 * the child's memory fails), and the /proc/self/pagemap descriptor was
 * opened on the parent's /proc/<pid> and scans the parent's memory. The
 * child must call refault_monitor_after_fork_child() before using the
 * monitor; until then every call on it fails with -ECHILD.
 *
 * All calls but refault_mechanism_name() are for the reclaim thread only
 * (one owner, no locking). Addresses and lengths are page aligned.
 */
#ifndef LULL_RECLAIM_UFFD_H
#define LULL_RECLAIM_UFFD_H

#include "base/linux_compat.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef enum {
    REFAULT_WP_ASYNC,
    REFAULT_PRESENT_SCAN,
    REFAULT_ACCOUNTING,
    REFAULT_OFF,
} refault_mechanism;

typedef struct refault_monitor {
    refault_mechanism kind;
    int uffd;                       /* -1 unless kind == REFAULT_WP_ASYNC */
    int pagemap;                    /* /proc/self/pagemap, -1 unless WP_ASYNC or PRESENT_SCAN */
    pid_t pid;                      /* process that opened the descriptors */
    refault_mechanism best_allowed; /* limit given to refault_monitor_open_at_most */
    bool uffd_from_dev;             /* created through /dev/userfaultfd */
    uint64_t uffd_features;         /* what the kernel offered in UFFDIO_API (0 if none) */
    const char *reason;             /* why a better mechanism is not active ("" if best) */
    uintptr_t scan_end;             /* where the last refault_scan() stopped */
    size_t page_size;
    /* counters (reclaim thread only) */
    uint64_t registered_bytes;
    uint64_t armed_bytes;
    uint64_t scans;
    uint64_t scanned_bytes;
    uint64_t written_pages; /* pages reported by refault_scan() */
} refault_monitor;

/* Choose and open the best mechanism that works (see above). Never fails:
 * the worst outcome is REFAULT_ACCOUNTING (or REFAULT_OFF when want_off).
 * m->reason says why a better mechanism is not active. */
refault_mechanism refault_monitor_open(refault_monitor *m, bool want_off);

/* The same, but no better than best (configuration: "monitor=present"
 * keeps userfaultfd out of the process entirely; see the trade-offs
 * above). refault_monitor_open(m, off) is
 * refault_monitor_open_at_most(m, off ? REFAULT_OFF : REFAULT_WP_ASYNC). */
refault_mechanism refault_monitor_open_at_most(refault_monitor *m, refault_mechanism best);

/* Register a whole segment, once, before it is published. Nothing is
 * protected yet. 0 or -errno; a no-op (0) unless REFAULT_WP_ASYNC. */
int refault_register(refault_monitor *m, void *addr, size_t len);

/* Start watching [addr, addr+len) after it was purged: write-protect it
 * (present pages and holes). 0 or -errno; a no-op (0) unless WP_ASYNC
 * (with PRESENT_SCAN the purge itself is the arming). */
int refault_arm(refault_monitor *m, void *addr, size_t len);

/* Which pages of [addr, addr+len) were touched since the range was armed
 * (WP_ASYNC: written; PRESENT_SCAN: present or swapped, not the zero page).
 * Fills out[0..max) with merged page regions and returns their number, or
 * -errno (-EOPNOTSUPP for ACCOUNTING / OFF, -EPERM in WP_ASYNC mode if part
 * of the range is not registered). *pages_out (if not NULL) gets the number
 * of pages found. With rearm (WP_ASYNC only, ignored otherwise) the pages
 * found are write-protected again in the same ioctl, so the next scan
 * reports only newer writes. If out fills up the walk stops early:
 * m->scan_end < addr+len, and a second call from m->scan_end continues. */
long refault_scan(refault_monitor *m, void *addr, size_t len, struct page_region *out, size_t max,
                  bool rearm, size_t *pages_out);

/* "wp_async", "present_scan", "accounting", "off". */
const char *refault_mechanism_name(refault_mechanism k);

/* Close the descriptors; the monitor becomes REFAULT_OFF. Registered VMAs
 * stay as they are (the kernel drops the registrations when the last
 * reference to the uffd goes). */
void refault_monitor_close(refault_monitor *m);

/* A register, arm or scan failed after the open had proved the mechanism
 * (a seccomp filter installed since denies the ioctl, a descriptor lost):
 * its page counts would stop, or count unarmed pages as written. Close the
 * descriptors and fall back to REFAULT_ACCOUNTING for good, with why (static
 * text) as the reason. kind is stored atomically: other threads read it
 * (the counter page). */
void refault_monitor_lost(refault_monitor *m, const char *why);

/* In a child after fork(), before anything else uses the monitor: forget
 * the parent's descriptors (close the child's copies) and open again with
 * the same limit (off stays off). Returns true when the caller must refault_register()
 * every live segment again (and may re-arm purged ranges): the child's
 * memory is not registered with the new context. Uses only async-signal-safe
 * system calls, so it may run in a pthread_atfork child handler. */
bool refault_monitor_after_fork_child(refault_monitor *m);

#endif
