/* Statistics: the accounting identity (every mapped byte in exactly one
 * term, per node and overall) and the reclaim figures, gathered into the
 * counter-page layout of include/lull/counters.h. Gathering reads the slice
 * maps and span descriptors with relaxed loads from any thread; each
 * segment's terms add up to its size by construction, so the identity holds
 * exactly in every snapshot, and the split between terms is exact whenever
 * no thread is allocating at that moment. */
#ifndef LULL_STATS_H
#define LULL_STATS_H

#include "lull/counters.h"

void lull_stats_collect(struct lull_counters *out);

/* The live huge blocks, and what they hold of the identity's live and
 * metadata terms (a header slice each). */
typedef struct lull_stats_huge {
    uint64_t blocks, live, metadata;
} lull_stats_huge;
/* The identity only (out->node_count, nodes[].acct and total, the rest 0),
 * after the calling thread's deferred free: the memory figures of
 * lull_stats() without the reclaim thread's (which start it), for
 * mallinfo2(). *huge: the live huge blocks' part of them. */
void lull_stats_memory(struct lull_counters *out, lull_stats_huge *huge);
/* Bytes given back to the kernel so far: purged by any backend or by a
 * caller of lull_purge_all(), and huge mappings unmapped (the counter
 * page's purge_bytes[] and huge_unmapped_bytes). Starts the reclaim thread,
 * as the statistics do. */
uint64_t lull_stats_given_back(void);

#endif
