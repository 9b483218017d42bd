/* glibc's <malloc.h> calls as a program makes them (a server's /metrics
 * reads mallinfo2, a big free is followed by malloc_trim(0), SIGUSR1 prints
 * malloc_stats), for tests/test_preload_programs.c to run under
 * LD_PRELOAD=liblull.so, where they must be lull's: the program knows
 * nothing of lull.
 *
 * It allocates and touches small blocks and a 40 MiB block, frees them,
 * trims, and prints on stdout one "key value" line per figure (mallinfo2
 * and mallinfo before and after, the trim's result, RSS around the trim),
 * then malloc_info's XML; malloc_stats() writes on stderr. Run it with
 * purging off (LULL_CONF=purge_delay_ms=never) so that only the trim
 * gives memory back.
 *
 * Usage: prog_glibc_calls [--bind-only]
 * (--bind-only: exit at once, for a run that only looks at how the
 * dynamic linker bound the calls, LD_BIND_NOW=1) */
#define _GNU_SOURCE
#include "tests/support/mem_check.h"

#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MiB ((size_t)1 << 20)
#define SMALL_BLOCKS 512
#define SMALL_SIZE ((size_t)4000)
#define BIG_SIZE (40 * MiB)

static void print_info(const char *when, struct mallinfo2 m) {
    printf("%s_arena %zu\n%s_uordblks %zu\n%s_fordblks %zu\n%s_hblks %zu\n%s_hblkhd %zu\n"
           "%s_keepcost %zu\n",
           when, m.arena, when, m.uordblks, when, m.fordblks, when, m.hblks, when, m.hblkhd, when,
           m.keepcost);
}

int main(int argc, char **argv) {
    static char *blocks[SMALL_BLOCKS];
    if (argc > 1 && !strcmp(argv[1], "--bind-only")) return 0;
    print_info("start", mallinfo2());
    for (int i = 0; i < SMALL_BLOCKS; i++) {
        blocks[i] = malloc(SMALL_SIZE);
        if (!blocks[i]) return 2;
        memset(blocks[i], 1, SMALL_SIZE);
    }
    char *big = malloc(BIG_SIZE);
    if (!big) return 2;
    memset(big, 1, BIG_SIZE);
    print_info("held", mallinfo2());
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo old = mallinfo();
#pragma GCC diagnostic pop
    printf("held_int_uordblks %d\nheld_int_hblkhd %d\n", old.uordblks, old.hblkhd);
    for (int i = 0; i < SMALL_BLOCKS; i++)
        free(blocks[i]);
    free(big);
    print_info("freed", mallinfo2());
    size_t rss_before = rss_bytes();
    int trimmed = malloc_trim(0);
    size_t rss_after = rss_bytes();
    printf("trim %d\nrss_before_trim %zu\nrss_after_trim %zu\n", trimmed, rss_before, rss_after);
    print_info("trimmed", mallinfo2());
    fflush(stdout);
    malloc_stats();
    if (malloc_info(0, stdout) != 0) return 3;
    return 0;
}
