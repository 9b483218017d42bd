/* Running one operation in a forked child with its stderr captured: an
 * operation that aborts the process (lull's invalid- and double-free
 * checks) is tested without killing the test, and its message is read. */
#ifndef LULL_TEST_FORK_CAPTURE_H
#define LULL_TEST_FORK_CAPTURE_H

#include <stddef.h>

typedef struct {
    int status;     /* from waitpid */
    char err[4096]; /* the child's stderr */
    size_t err_len;
} child_result;

/* Run fn(arg) in a child; the child exits 0 if fn returns. stderr goes to
 * the pipe already during fork, so what the child's fork handlers say is
 * the child's output too. */
void run_in_child(void (*fn)(void *), void *arg, child_result *r);
/* The child died of SIGABRT, and its stderr says "lull", the address as
 * %p prints it, and `word`. */
void expect_abort(const child_result *r, const void *addr, const char *word);
/* Read fd to its end (at most cap - 1 bytes), NUL-terminated; *len read. */
void read_all_fd(int fd, char *buf, size_t cap, size_t *len);

#endif
