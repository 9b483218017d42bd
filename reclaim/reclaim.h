/* The reclaim thread: the only thread of the process that gives memory back
 * to the kernel. It claims FREE_DIRTY slices older than the purge delay,
 * purges them in batches through a purge backend (io_uring by default),
 * keeps freed huge mappings in a bounded cache (purged after the delay,
 * unmapped when unused for long), and publishes statistics. Request threads
 * only put freed huge mappings into its cache or queue (atomic operations)
 * and never wake it with a system call: it finds its work on its own tick. */
#ifndef LULL_RECLAIM_H
#define LULL_RECLAIM_H

#include "src/types.h"

#include <stdbool.h>
#include <stdint.h>

typedef struct lull_reclaim_stats {
    uint64_t ticks;
    uint64_t cpu_ns;
    uint64_t purge_runs;     /* slice runs purged */
    uint64_t purged_bytes;   /* total, all backends */
    uint64_t purge_failures; /* runs the kernel refused (slices went back to dirty) */
    uint64_t huge_freed;     /* huge mappings unmapped */
    uint64_t huge_freed_bytes;
    uint64_t huge_purged_bytes; /* cached huge mappings purged (kept mapped for reuse) */
    uint64_t inline_purges;     /* purges done on a request thread (inline_purge=on) */
    bool running;
    bool start_failed;
    int backend; /* lull_backend_kind in use */
    char backend_reason[160];
    long delay_ms; /* purge delay in force */
    int mode;      /* lull_purge_mode in force (DONTNEED or FREE) */
} lull_reclaim_stats;

void lull_reclaim_register(void);
/* Hand a freed huge block to the reclaim thread: its cache, or its queue
 * (called from free on any thread; no system call). */
void lull_reclaim_huge_push(lull_huge *h);
void lull_reclaim_get_stats(lull_reclaim_stats *out);
/* The purge delay the next tick uses (resolves "auto"). */
long lull_reclaim_effective_delay(void);

#endif
