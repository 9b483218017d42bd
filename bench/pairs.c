/*
 * pairs.c: the loop that callgrind.sh counts instructions of.
 *
 *   pairs --mode fixed --n N   N x { p = malloc(32); write p; free(p) }
 *   pairs --mode mixed --n N   N random replacements in a working set of
 *                              1000 objects of 16-1024 B (one free and one
 *                              malloc each)
 *
 * Only the function bench_pair_loop_<mode> (and what it calls: the
 * allocator) is counted, with callgrind's --toggle-collect; callgrind.sh
 * runs two values of N and divides the difference of the counts by the
 * difference of N, so that first-call and initialisation costs cancel.
 */
#include "bench_common.h"

#define SC "pairs"
#define WS 1000

static void *volatile sink;

__attribute__((noinline, noreturn, cold)) static void null_result(uint64_t i) {
    printf("ERROR pairs malloc returned NULL at iteration %llu\n", (unsigned long long)i);
    exit(1);
}

__attribute__((noinline, used)) void bench_pair_loop_fixed(uint64_t n) {
    for (uint64_t i = 0; i < n; i++) {
        char *p = malloc(32);
        if (!p) null_result(i);
        p[0] = (char)i;
        sink = p;
        free(p);
    }
}

__attribute__((noinline, used)) void bench_pair_loop_mixed(void **slots, uint64_t n,
                                                           uint64_t seed) {
    uint64_t rng = seed;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t r = rng_next(&rng);
        size_t s = (size_t)(r % WS);
        free(slots[s]);
        char *p = malloc(16 + (size_t)((r >> 32) % 1009));
        if (!p) null_result(i);
        p[0] = (char)i;
        slots[s] = p;
    }
}

int main(int argc, char **argv) {
    const char *mode = "fixed";
    uint64_t n = 1000000;
    for (int i = 1; i < argc; i++) {
        if (!arg_value(argc, argv, &i, "--mode", &mode) && !arg_u64(argc, argv, &i, "--n", &n)) {
            fprintf(stderr, "usage: pairs [--mode fixed|mixed] [--n N]\n");
            return 2;
        }
    }
    bench_check_preload(SC);
    /* Initialise the allocator outside the counted function. One block of
     * the loop's size stays live: a program's heap is never empty, and
     * without it the pair measured lull's path for a span that its last
     * free empties (8 instructions more), which lull took only while its
     * reclaim thread, started with the process, left a block of 32 bytes
     * (pthread_create's) beside the loop's. */
    void *first = malloc(32);
    if (!first) null_result(0);
    free(first);
    static void *volatile neighbour;
    neighbour = malloc(32);
    if (!neighbour) null_result(0);
    if (strcmp(mode, "fixed") == 0) {
        bench_pair_loop_fixed(n);
    } else if (strcmp(mode, "mixed") == 0) {
        static void *slots[WS];
        uint64_t rng = 1;
        for (int i = 0; i < WS; i++)
            slots[i] = malloc(16 + rng_next(&rng) % 1009);
        bench_pair_loop_mixed(slots, n, 2);
        for (int i = 0; i < WS; i++)
            free(slots[i]);
    } else {
        fprintf(stderr, "unknown mode %s\n", mode);
        return 2;
    }
    printf("INFO %s done mode=%s n=%llu\n", SC, mode, (unsigned long long)n);
    return 0;
}
