/* A program built against an installed lull (tests/install/run.sh): through
 * pkg-config, and through find_package(lull) (consumer/). It says where
 * lull's code came from (the library file, or the program itself when
 * linked with liblull.a) and whether lull serves its allocations; exits 1
 * if it does not.
 *
 *   app [override]   override: malloc itself must be lull's too */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    Dl_info where;
    if (!dladdr((void *)lull_version, &where) || !where.dli_fname) return 1;
    struct lull_counters c;
    if (strcmp(lull_version(), LULL_VERSION_STRING) || lull_stats(&c) != 0) {
        fprintf(stderr, "lull %s (header %s): lull_stats failed\n", lull_version(),
                LULL_VERSION_STRING);
        return 1;
    }
    void *p = lull_malloc(100);
    int ok = lull_owns(p);
    lull_free(p);
    if (argc > 1 && !strcmp(argv[1], "override")) {
        void *q = malloc(100);
        ok = ok && lull_owns(q);
        free(q);
    }
    printf("lull %s from %s: %s\n", lull_version(), where.dli_fname, ok ? "ok" : "NOT lull's");
    return ok ? 0 : 1;
}
