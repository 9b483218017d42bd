/* Fault injection at each kernel call lull makes. A test (or LULL_FAULT in
 * the environment, read once at start) arms a point; the next calls at that
 * point fail as the kernel would, so every fallback is exercised by a test
 * rather than hoped for. Disarmed, a check is one relaxed load. */
#ifndef LULL_FAULT_H
#define LULL_FAULT_H

#include "base/hidden.h"
#include <stdatomic.h>
#include <stdbool.h>

typedef enum {
    LULL_FAULT_MMAP,         /* segment / huge mmap returns ENOMEM */
    LULL_FAULT_URING_SETUP,  /* io_uring_queue_init fails */
    LULL_FAULT_URING_SUBMIT, /* io_uring_submit fails */
    LULL_FAULT_URING_CQE,    /* a madvise completion reports an error */
    LULL_FAULT_PROCESS_MADVISE,
    LULL_FAULT_UFFD,          /* userfaultfd creation denied */
    LULL_FAULT_PAGEMAP_SCAN,  /* PAGEMAP_SCAN unsupported */
    LULL_FAULT_SHM_OPEN,      /* counter page cannot be created */
    LULL_FAULT_THREAD_CREATE, /* reclaim thread cannot start */
    LULL_FAULT_NUMA,          /* libnuma missing */
    LULL_FAULT_COLLAPSE,      /* MADV_COLLAPSE fails (EAGAIN) */
    /* a purge's kernel call (an io_uring completion, a process_madvise or
     * a madvise) fails with ENOMEM, as when the kernel is short of memory */
    LULL_FAULT_PURGE_NOMEM,
    /* an io_uring madvise completion reports ECANCELED, as io-wq cancels a
     * request when no worker could be started for it (RLIMIT_NPROC or
     * pids.max reached, the kernel short of memory) */
    LULL_FAULT_URING_NO_WORKER,
    LULL_FAULT_COUNT
} lull_fault_point;

/* Count of calls still to fail at each point; -1 means fail forever. */
extern LULL_HIDDEN _Atomic int lull_fault_armed[LULL_FAULT_COUNT];

static inline bool lull_fault(lull_fault_point p) {
    int n = atomic_load_explicit(&lull_fault_armed[p], memory_order_relaxed);
    if (__builtin_expect(n == 0, 1)) return false;
    /* one of the n calls left, taken in one step: a load, then a decrement,
     * let two threads that both read 1 both fail, and leave -1, which
     * means "fail forever". A failed compare-exchange reloads n: another
     * thread took the last call (0: this one goes through) or re-armed. */
    while (n > 0 &&
           !atomic_compare_exchange_weak_explicit(&lull_fault_armed[p], &n, n - 1,
                                                  memory_order_relaxed, memory_order_relaxed)) {
    }
    return n != 0;
}

/* Arm point p for the next n calls (n = -1: all of them; 0 disarms). */
void lull_fault_arm(lull_fault_point p, int n);
/* Parse "name[:count],name..." (names: mmap, uring_setup, uring_submit,
 * uring_cqe, process_madvise, uffd, pagemap_scan, shm_open, thread_create,
 * numa, collapse, purge_nomem, uring_no_worker; no count: -1). An item with another name or
 * a count that is not a number from -1 up arms nothing and gets one
 * message. */
void lull_fault_parse(const char *spec);

#endif
