/* Purge backends: how the reclaim thread gives ranges of memory back to the
 * kernel. Three mechanisms, best first:
 *
 *   uring            IORING_OP_MADVISE, one SQE per range, 256-entry ring set
 *                    up with IORING_SETUP_SINGLE_ISSUER (no SQPOLL); the
 *                    madvise runs in an io-wq worker of the opening thread,
 *                    pinned with IORING_REGISTER_IOWQ_AFF when a CPU set is
 *                    given.
 *   process_madvise  one syscall per batch of up to 256 iovecs on a pidfd of
 *                    this process (any advice on self needs kernel 6.13+).
 *   madvise          one syscall per range; always available.
 *
 * Opening probes each mechanism with a harmless call on a scratch page and
 * settles on the best one that works. A mechanism that fails at run time
 * (submit error, or a completion that fails where the next mechanism
 * succeeds, unless with EAGAIN, EINTR, ENOMEM or ECANCELED:
 * purge_err_blames_mechanism)
 * is dropped for good: the failed ranges are redone on the next mechanism
 * in the same call, so no range is left unpurged silently, and the reason
 * is kept in fallback_reason.
 *
 * Nothing here allocates: the state is one fixed-size struct, buffers live
 * on the stack (purge_backend_run needs about 17 KiB of it) and the ring is
 * mmapped by liburing. Not thread-safe: one thread (the reclaim thread)
 * opens, runs and closes a backend. The counters may be read from any
 * thread with purge_backend_counter(). */
#ifndef LULL_RECLAIM_PURGE_BACKEND_H
#define LULL_RECLAIM_PURGE_BACKEND_H

#include "base/config.h" /* lull_backend_kind; defines _GNU_SOURCE first */

#include <errno.h>
#include <liburing.h>
#include <sched.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A range to purge: addr page aligned, len at most PURGE_RANGE_MAX (a longer
 * range is still purged, with one plain madvise call). len need not be a
 * multiple of the page size (the kernel rounds it up); len 0 succeeds. */
typedef struct {
    void *addr;
    size_t len;
} purge_range;

#define PURGE_RANGE_MAX ((size_t)16 << 20)
#define PURGE_RING_ENTRIES 256u /* SQ entries; also the batch size of every mechanism */
#define PURGE_KIND_COUNT 4      /* counters are indexed by lull_backend_kind */

/* Per mechanism (index LULL_BACKEND_URING, _PROCESS_MADVISE, _MADVISE). */
typedef struct {
    uint64_t calls;  /* syscalls made: io_uring_enter, process_madvise, madvise */
    uint64_t ranges; /* ranges purged successfully by this mechanism */
    uint64_t bytes;  /* bytes of those ranges */
} purge_kind_counters;

typedef struct purge_backend {
    lull_backend_kind kind; /* the mechanism in use */
    lull_backend_kind want; /* as asked at open */
    bool is_open;
    bool ring_open;   /* ring is set up and owned by the opening thread */
    bool pm_ok;       /* process_madvise on self works (probed) */
    bool iowq_pinned; /* io-wq workers pinned to the given CPU set */
    int iowq_aff_err; /* 0, or -errno of the affinity registration */
    int pidfd;        /* pidfd of this process, or -1 */
    unsigned ring_flags;
    int fallback_errno; /* errno behind fallback_reason (positive), or 0 */
    /* Why a better mechanism is not in use, "" if none. Plain text, updated
     * when the backend degrades at run time. */
    char fallback_reason[160];
    struct io_uring ring;
    /* Counters: written only by the owning thread, read with
     * purge_backend_counter() from any thread. */
    purge_kind_counters per_kind[PURGE_KIND_COUNT];
    uint64_t runs;      /* purge_backend_run calls */
    uint64_t errors;    /* ranges of purges reported failed (results[i] < 0) */
    uint64_t fallbacks; /* times a mechanism was given up (at open or at run time) */
    uint64_t redone;    /* ranges redone on a lower mechanism after a failure */
    /* The run in progress gives no memory back (the warm reserve prefaults
     * with MADV_POPULATE_WRITE): its ranges are not counted as purged. */
    bool not_purging;
} purge_backend;

/* Open on the calling thread, which must then be the only one to run and
 * close it. b need not be initialised. want = LULL_BACKEND_AUTO tries
 * io_uring, then process_madvise, then madvise; a specific want that is
 * unavailable falls back the same way down the list. iowq_cpus (nullable):
 * pin the ring's io-wq workers there; iowq_aff_err reports a failure (the
 * ring is still used). Returns the kind in use; never fails. */
lull_backend_kind purge_backend_open(purge_backend *b, lull_backend_kind want,
                                     const cpu_set_t *iowq_cpus);

/* Purge n ranges with advice (MADV_DONTNEED or MADV_FREE) and return once all
 * are done. Returns how many succeeded; results (nullable) gets 0 or the
 * negative errno of each range. A closed (or zeroed, never opened) backend
 * purges with madvise. Another advice (the warm reserve's
 * MADV_POPULATE_WRITE) runs the same way, but no range of it counts in
 * per_kind ranges, bytes and calls nor in errors, which are purges'. */
size_t purge_backend_run(purge_backend *b, const purge_range *r, size_t n, int advice,
                         int *results);

lull_backend_kind purge_backend_kind(const purge_backend *b);
/* "uring", "process_madvise", "madvise" ("auto" for LULL_BACKEND_AUTO). */
const char *purge_backend_name(lull_backend_kind k);
/* Release the ring and the pidfd; the backend then purges with madvise. */
void purge_backend_close(purge_backend *b);
/* In a child after fork(): drop what was inherited without touching it. The
 * ring memory is MADV_DONTFORK (absent in the child) and is never read or
 * unmapped here; only the fds are closed. Afterwards the backend is closed
 * (madvise) and may be opened again by the child's reclaim thread. */
void purge_backend_forget_after_fork(purge_backend *b);

/* Relaxed read of one counter field, e.g.
 * purge_backend_counter(&b->per_kind[LULL_BACKEND_URING].bytes). */
static inline uint64_t purge_backend_counter(const uint64_t *field) {
    return __atomic_load_n(field, __ATOMIC_RELAXED);
}

/* The ranges of slice runs the arena claimed (numa/arena.h), for a purge. */
struct lull_slice_run;
void purge_ranges_of_runs(const struct lull_slice_run *runs, size_t n, purge_range *ranges);

/* ---- Internal to reclaim/backend_*.c ---------------------------------- */

#define PURGE_PENDING 1 /* results slot not filled yet (real results are <= 0) */

/* Single-writer counter update that readers on other threads see whole. */
static inline void purge_count(uint64_t *field, uint64_t v) {
    __atomic_store_n(field, *field + v, __ATOMIC_RELAXED);
}

/* Ranges a mechanism completed: counted as purged unless the run was not a
 * purge (per_kind ranges and bytes are what the counter page reports as
 * purged pages). */
static inline void purge_count_done(purge_backend *b, lull_backend_kind k, uint64_t ranges,
                                    uint64_t bytes) {
    if (b->not_purging) return;
    purge_count(&b->per_kind[k].ranges, ranges);
    purge_count(&b->per_kind[k].bytes, bytes);
}

/* A system call a mechanism made (*calls: its per_kind calls): counted
 * unless the run was not a purge (per_kind calls are the counter page's
 * purge_syscalls, every call made to purge, retries after EAGAIN or EINTR
 * and failed calls included: what purging cost; counted, each prefault of
 * the warm reserve added one with nothing purged,
 * tests/test_purged_pages_prefault.c). */
static inline void purge_count_syscall(purge_backend *b, uint64_t *calls) {
    if (!b->not_purging) purge_count(calls, 1);
}

/* Each mechanism purges n <= PURGE_RING_ENTRIES valid ranges (page aligned,
 * 0 < len <= PURGE_RANGE_MAX), filling res[] (non-NULL) with 0 / -errno,
 * and returns the number that succeeded. */
size_t purge_madvise_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res);
int purge_madvise_one(purge_backend *b, const purge_range *r, int advice);
size_t purge_pm_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res);
size_t purge_uring_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res);

/* Open helpers: 0, or -errno with *what naming the step that failed. The
 * probe range is a scratch page (or an empty range if none could be mapped). */
int purge_pm_open(purge_backend *b, const purge_range *probe, const char **what);
int purge_uring_open(purge_backend *b, const cpu_set_t *iowq_cpus, const purge_range *probe,
                     const char **what);
/* fd_ok = false: the fd may no longer be ours (EBADF): drop it unclosed. */
void purge_uring_close(purge_backend *b, bool fd_ok);
void purge_pm_close(purge_backend *b, bool fd_ok);

/* Run on the best mechanism below `below` (for redoing failed ranges). */
size_t purge_run_below(purge_backend *b, lull_backend_kind below, const purge_range *r, size_t n,
                       int advice, int *res);
/* Give up mechanism k for good: release it, move kind down if k was in use,
 * record why (what: static text, err: positive errno or 0) and say so. */
void purge_degrade(purge_backend *b, lull_backend_kind k, const char *what, int err);
/* Write "what: ENAME" (or just what) into fallback_reason. */
void purge_set_reason(purge_backend *b, const char *what, int err);
/* Errors that say nothing about the mechanism (try again later). */
static inline bool purge_err_transient(int err) {
    return err == -EINTR || err == -EAGAIN;
}
/* Does a range that failed with err on a mechanism, and that the next one
 * down then purged, show the mechanism at fault (and so give it up)? Not
 * a transient error, nor ENOMEM: IORING_OP_MADVISE and process_madvise
 * run the kernel's do_madvise, as madvise(2) does, so their ENOMEM is
 * madvise's: a range not mapped (which the redo reports again) or the
 * kernel short of memory for a moment (a MADV_POPULATE_WRITE of the warm
 * reserve under memory pressure). A short spell of it gave io_uring up
 * for good (tests/test_backend.c, *_enomem_keeps_*). Nor ECANCELED: lull
 * cancels no request and madvise never answers it; io-wq does, for every
 * request queued while it has no worker and cannot start one
 * (create_io_thread's EAGAIN, retried 3 times since 6.11 and in 6.1.y and
 * 6.6.y stable: the user at RLIMIT_NPROC, the cgroup at pids.max; or
 * ENOMEM). Seen on 6.18: the last worker left (its CPU taken out of the
 * cpuset) while the user was at its RLIMIT_NPROC gave io_uring up for good
 * (uring_no_worker_keeps_uring). While it lasts, each batch waits for
 * io-wq's retries (about 30 ms) before its redo. */
static inline bool purge_err_blames_mechanism(int err) {
    return !purge_err_transient(err) && err != -ENOMEM && err != -ECANCELED;
}

#endif
