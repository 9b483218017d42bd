/* glibc's __libc_* malloc calls mixed with malloc and free, as code written
 * for glibc makes them (tests/support/libc_names.h), for
 * tests/test_preload_programs.c to run with and without
 * LD_PRELOAD=liblull.so: under the preload, both families must be lull's.
 * It knows nothing of lull, and prints "OK" when every block held what it
 * was given.
 *
 * Usage: prog_libc_names [--bind-only]
 * (--bind-only: exit at once, for a run that only looks at how the
 * dynamic linker bound the calls, LD_BIND_NOW=1) */
#include "tests/support/libc_names.h"

#include <stdio.h>
#include <string.h>

/* cfree, glibc's old name of free: since glibc 2.26 only a compat symbol,
 * which binaries built before then reach through a reference to
 * cfree@GLIBC_2.2.5. This program makes the same reference. */
void cfree_of_old_binaries(void *p);
__asm__(".symver cfree_of_old_binaries, cfree@GLIBC_2.2.5");

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "--bind-only")) return 0;
    const char *wrong = libc_names_mix();
    char *old = malloc(100);
    if (!wrong && !old) wrong = "malloc(100) failed";
    if (!wrong) {
        memset(old, 8, 100);
        cfree_of_old_binaries(old); /* malloc's block, freed by the old name */
    }
    if (wrong) {
        fprintf(stderr, "libc_names: %s\n", wrong);
        return 1;
    }
    printf("OK\n");
    return 0;
}
