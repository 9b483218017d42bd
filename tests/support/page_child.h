/* The process side of the counter page tests that run a lull process of
 * their own (test_counter_page, test_heap_profile_request): it reports
 * key=value lines to its harness on fd PAGE_CHILD_REPORT_FD, and waits for
 * its own page. No Criterion: it runs before Criterion starts. */
#ifndef LULL_TEST_PAGE_CHILD_H
#define LULL_TEST_PAGE_CHILD_H

#include <stdbool.h>
#include <stddef.h>

#define PAGE_CHILD_REPORT_FD 3

/* A line (or several) to the harness; _exit(90) if the fd is gone. */
void page_child_report(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Until this process's reclaim thread has created its page (its name into
 * `name`) and finished one more tick, so that what the tick that created
 * it does after that is done; false after 20 s or without a thread. */
bool page_child_wait_own_page(char *name, size_t len);

#endif
