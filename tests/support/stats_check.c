/* See stats_check.h. */
#include "tests/support/stats_check.h"
#include "lull.h"

#include <criterion/criterion.h>

struct lull_counters stats_checked(const char *phase) {
    struct lull_counters c;
    cr_assert_eq(lull_stats(&c), 0);
    cr_assert_eq(lull_counters_accounting_sum(&c.total), c.total.mapped,
                 "%s: terms sum to %llu, mapped %llu", phase,
                 (unsigned long long)lull_counters_accounting_sum(&c.total),
                 (unsigned long long)c.total.mapped);
    struct lull_counters_accounting nodes = {0};
    for (uint64_t n = 0; n < c.node_count; n++) {
        const struct lull_counters_accounting *a = &c.nodes[n].acct;
        cr_assert_eq(lull_counters_accounting_sum(a), a->mapped,
                     "%s: node %llu: terms sum to %llu, mapped %llu", phase, (unsigned long long)n,
                     (unsigned long long)lull_counters_accounting_sum(a),
                     (unsigned long long)a->mapped);
        nodes.mapped += a->mapped;
        nodes.live += a->live;
        nodes.span_free += a->span_free;
        nodes.purged += a->purged;
    }
    cr_assert_eq(nodes.mapped, c.total.mapped, "%s: nodes' mapped sum to the total", phase);
    cr_assert_eq(nodes.live, c.total.live, "%s: nodes' live sum to the total", phase);
    cr_assert_eq(nodes.span_free, c.total.span_free, "%s: nodes' span_free sum to the total",
                 phase);
    cr_assert_eq(nodes.purged, c.total.purged, "%s: nodes' purged sum to the total", phase);
    return c;
}
