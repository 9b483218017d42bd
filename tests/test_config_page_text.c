/* The configuration as the counter page and lull_print_stats show it: the
 * "key=value,..." text goes into the page's config field, 256 bytes
 * (LULL_COUNTERS_CONFIG_LEN). The defaults take 253 of them, so a value a
 * few digits longer than its default (heap_limit_mb=1024) did not fit, and
 * the text was cut inside the last value: the page and lull_print_stats
 * said "heap_limit_mb=102" while the limit was 1024 MiB. A text that does
 * not fit must end at a whole key=value, and say that the rest is missing.
 *
 * Run with LULL_COUNTER_PAGE=off (as the other tests: the text does not
 * need a page). */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "base/config.h"
#include "src/stats.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

/* Every "key=value" of shown (cut short or not) must be one of full's. */
static void assert_whole_pairs(const char *shown, const char *full) {
    char copy[LULL_COUNTERS_CONFIG_LEN + 1];
    snprintf(copy, sizeof copy, "%s", shown);
    char *save = NULL;
    for (char *pair = strtok_r(copy, ",", &save); pair; pair = strtok_r(NULL, ",", &save)) {
        if (strcmp(pair, "...") == 0) continue; /* the mark of a cut text */
        char want[LULL_COUNTERS_CONFIG_LEN + 2];
        snprintf(want, sizeof want, ",%s,", pair);
        char wide[1024];
        snprintf(wide, sizeof wide, ",%s,", full);
        cr_assert(strstr(wide, want) != NULL, "the page shows '%s', which is not in force: %s\n%s",
                  pair, full, shown);
    }
}

Test(config_page_text, a_text_too_long_for_the_page_is_cut_between_pairs) {
    cr_assert(lull_configure("heap_limit_mb", "1024"));
    char full[1024];
    size_t n = lull_config_format(full, sizeof full);
    cr_assert_lt(n, sizeof full);
    cr_assert(strstr(full, "heap_limit_mb=1024"), "%s", full);
    cr_assert_geq(n, (size_t)LULL_COUNTERS_CONFIG_LEN, "the text fits the page now: %s", full);

    /* what the counter page gets */
    static struct lull_counters c;
    lull_stats_collect(&c);
    cr_assert_eq(c.config[sizeof c.config - 1], '\0');
    assert_whole_pairs(c.config, full);
    cr_assert(strstr(c.config, ",..."), "a cut text does not say so: %s", c.config);

    /* and every size of buffer: never a value cut short */
    for (size_t len = 1; len <= n + 1; len++) {
        char buf[1024];
        memset(buf, 'x', sizeof buf);
        lull_config_format(buf, len);
        cr_assert_lt(strlen(buf), len);
        assert_whole_pairs(buf, full);
    }
    cr_assert(lull_configure("heap_limit_mb", "0"));
}
