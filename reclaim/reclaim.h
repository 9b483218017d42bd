/* The reclaim thread: the only thread of the process that gives memory back
 * to the kernel. It claims FREE_DIRTY slices older than the purge delay,
 * purges them in batches through a purge backend (io_uring by default),
 * keeps freed huge mappings in a bounded cache (purged after the delay,
 * unmapped when unused for long), and publishes statistics. Request threads
 * only put freed huge mappings into its cache or queue (atomic operations)
 * and do not wake it with a system call: it finds its work on its own tick.
 * The one exception is a huge malloc that found no fit while mappings are
 * cached: it is about to mmap anyway, and the mappings it passed over are
 * purged at once (reclaim_thread.c, huge_reuse).
 *
 * It blocks every signal (the program's signals are the program's threads'
 * to take), and at fork no step of it is half done: each step that takes
 * slices or huge mappings out of every map, queue or slot and puts them back
 * (claim, purge, finish) runs under a lock that fork's prepare handler
 * takes, so the child finds each slice in exactly one state. */
#ifndef LULL_RECLAIM_H
#define LULL_RECLAIM_H

#include "base/hidden.h"
#include "base/types.h"

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

typedef struct lull_reclaim_stats {
    uint64_t ticks;
    uint64_t cpu_ns;
    uint64_t purge_runs;        /* slice runs purged */
    uint64_t purged_bytes;      /* slice runs, parked pages and cached huge mappings purged (not the
                                   purge before an unmap, a tail or a drained warm reserve: the backends
                                   count every purge, lull_counters.purge_bytes[]) */
    uint64_t purge_failures;    /* runs the kernel refused (slices went back to dirty) */
    uint64_t huge_freed;        /* huge mappings unmapped whole */
    uint64_t huge_freed_bytes;  /* their bytes, and the shrunk blocks' tails unmapped */
    uint64_t huge_purged_bytes; /* cached huge mappings purged (kept mapped for reuse) */
    uint64_t page_purged_bytes; /* parked pages of in-use spans purged (numa/page_park.h) */
    uint64_t inline_purges;     /* purges done on a request thread (inline_purge=on, or
                                 * lull_purge_all with no reclaim thread) */
    uint64_t forced_ticks;      /* ticks that purged everything (purge_now.h) */
    uint64_t limit_waits;       /* allocations over the heap limit that waited for one */
    uint64_t huge_backlog_waits; /* huge mallocs that waited for a tick to unmap the queue */
    /* ranges the kernel refused in purges made on a caller's own backend
     * (lull_purge_now_on_caller); the reclaim thread's backend counts its
     * own (purge_backend.errors), the runs refused are purge_failures */
    uint64_t caller_purge_errors;
    /* ... and what those purges did, all with plain madvise (the caller's
     * backend is never opened): its ranges, bytes and system calls, which
     * the counter page adds to the madvise backend's figures and to
     * purged_pages, or a purge_all without a reclaim thread read as none */
    uint64_t caller_purge_ranges, caller_purge_bytes, caller_purge_calls;
    bool running;
    bool start_failed;
    int backend; /* lull_backend_kind in use */
    char backend_reason[160];
    long delay_ms; /* purge delay in force */
    int mode;      /* lull_purge_mode in force (DONTNEED or FREE) */
} lull_reclaim_stats;

void lull_reclaim_register(void);
/* The CPUs the process may run on at its start, which the reclaim thread
 * takes whichever thread creates it: read by the library constructor even
 * when everything else waits for the first allocation (src/init.c). */
void lull_reclaim_note_start_cpus(void);

/* Run by the reclaim thread each tick, if set: src/heap.c's collection of
 * the remote frees into abandoned heaps (reclaim/ knows no heap). */
extern void (*lull_reclaim_collect_hook)(void);

/* The reclaim thread is not started with the process, nor by the atfork
 * handler in a fork child: a process that execs or exits soon stays
 * single-threaded (a child can unshare a user namespace, and a fork+exec
 * or a short program pays for no thread, no ring and no monitor). It
 * starts on first need instead: lull_reclaim_now or the statistics start
 * it at once; a span given back to an arena, a huge block freed or a heap
 * abandoned at its thread's exit marks it wanted, and the next start point
 * starts it; a start point also starts it once the
 * process has run LULL_RECLAIM_START_AFTER_MS without needing it (its
 * counter page is due a second later). The start points are where the
 * calling thread is in no half-done heap update: a span about to be taken
 * from an arena, a large or huge allocation (an aligned huge block takes
 * no span, and need not pass through malloc's slow path), malloc's slow path,
 * lull_thread_collect(), an allocation over the heap limit (it asks for a purge, base/resident.h).
 * Never a free of any size (session 22): glibc frees the TLS vectors of cached thread stacks
 * holding its stack cache's lock, which pthread_create takes, and a join that freed one into an
 * abandoned heap hung there, every signal blocked (tests/test_reclaim_start.c), and a huge free
 * there (a dlopen'ed library's thread-local array) hung the same way
 * (tests/test_reclaim_start_tls.c); nor where a free
 * gives a span back: pthread_create allocates (glibc's TLS vector), and
 * that malloc would run on a heap half way through an update (heap.c
 * walks its queues around span releases). A free wants the thread; the
 * next allocation's slow path starts it. */
enum {
    LULL_RECLAIM_NOT_DEFERRED, /* the thread runs, or never will */
    LULL_RECLAIM_DEFERRED,     /* not started, nothing to purge yet */
    LULL_RECLAIM_WANTED,       /* ... and a span was given back */
    LULL_RECLAIM_STARTING,     /* a thread is creating it */
};
#define LULL_RECLAIM_START_AFTER_MS 1000
extern LULL_HIDDEN _Atomic int lull_reclaim_deferred;
void lull_reclaim_want_slow(void);
void lull_reclaim_start_point_slow(void);
/* Start a deferred thread now (the calling thread holds no lull lock and
 * is in no heap update). */
void lull_reclaim_start_now(void);
/* Set by a thread whose lull heap is gone (src/heap.c, at its exit), or
 * that had none and is past its TSD destructors: it never creates the
 * reclaim thread. Its late allocations run under the late
 * heap's lock, which pthread_create's own malloc would take again. */
extern __thread bool lull_reclaim_no_start __attribute__((tls_model("initial-exec")));

/* There is work for the thread (a span went back to its arena, a heap was
 * abandoned): a deferred one is wanted. Any thread; one relaxed load. */
static inline void lull_reclaim_want(void) {
    if (__builtin_expect(atomic_load_explicit(&lull_reclaim_deferred, memory_order_relaxed) ==
                             LULL_RECLAIM_DEFERRED,
                         0))
        lull_reclaim_want_slow();
}

/* A start point (above): one relaxed load once the thread runs. */
static inline void lull_reclaim_start_point(void) {
    if (__builtin_expect(atomic_load_explicit(&lull_reclaim_deferred, memory_order_relaxed) !=
                             LULL_RECLAIM_NOT_DEFERRED,
                         0))
        lull_reclaim_start_point_slow();
}
/* Hand a freed huge block to the reclaim thread: its cache, or its queue
 * (called from free on any thread; no system call). */
void lull_reclaim_huge_push(lull_huge *h);
void lull_reclaim_get_stats(lull_reclaim_stats *out);
/* lull_purge_all's purge (purge_now.h), returning when it is done: a forced
 * tick of the reclaim thread, started if deferred; with no reclaim thread,
 * on the caller. */
void lull_reclaim_purge_all(void);
/* The purge delay the next tick uses (resolves "auto"). */
long lull_reclaim_effective_delay(void);

#endif
