/* See page_child.h. */
#include "tests/support/page_child.h"
#include "lull.h"
#include "src/counter_page.h"
#include "tests/support/timing.h"

#include <stdarg.h>
#include <stdio.h>
#include <unistd.h>

void page_child_report(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n > 0 && write(PAGE_CHILD_REPORT_FD, buf, (size_t)n) != n) _exit(90);
}

bool page_child_wait_own_page(char *name, size_t len) {
    for (uint64_t until = now_ms() + 20000; now_ms() < until;) {
        if (!lull_reclaim_now()) return false;
        const char *n = counter_page_name();
        if (n) {
            snprintf(name, len, "%s", n);
            lull_reclaim_now();
            return true;
        }
        sleep_ms(10);
    }
    return false;
}
