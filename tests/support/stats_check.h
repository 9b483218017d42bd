/* lull_stats() with the accounting identity checked: the terms sum to
 * mapped, overall and on every node, and the nodes' mapped, live,
 * span_free and purged sum to the totals. `phase` names the moment in the
 * failure messages. */
#ifndef LULL_TEST_STATS_CHECK_H
#define LULL_TEST_STATS_CHECK_H

#include "lull/counters.h"

struct lull_counters stats_checked(const char *phase);

#endif
