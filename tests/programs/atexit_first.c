/* A program whose first allocation is the C library's own, made while it
 * holds its exit-handler lock: glibc keeps 32 atexit handlers in a static
 * block, and the 33rd registration callocs the next block inside
 * __internal_atexit, under __exit_funcs_lock. Under LD_PRELOAD=liblull.so
 * that calloc is the process's first allocation, where lull starts.
 *
 * Usage: prog_atexit_first
 *
 * Registers 40 handlers before it allocates anything, then mallocs and
 * frees a block, and prints "allocated" (with write(): stdio would
 * allocate) and exits 0. Each handler adds one to a count, and the last
 * one checks that all 40 ran (exit 3 if not). */
#include <stdlib.h>
#include <unistd.h>

#define HANDLERS 40

static int ran;

static void count(void) {
    ran++;
}

static void check(void) {
    if (ran != HANDLERS) _exit(3);
}

int main(void) {
    /* runs last: exit() runs the handlers in the reverse order */
    if (atexit(check) != 0) return 2;
    for (int i = 0; i < HANDLERS; i++)
        if (atexit(count) != 0) return 2;
    void *p = malloc(100);
    if (!p) return 2;
    free(p);
    static const char msg[] = "allocated\n";
    if (write(1, msg, sizeof msg - 1) != (ssize_t)(sizeof msg - 1)) return 2;
    return 0;
}
