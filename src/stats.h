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

#endif
