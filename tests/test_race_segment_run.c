/* The segment run (base/segment_map.h) grows when a segment is published
 * (lull_segment_publish: set in the map, then the run grown), by the
 * thread that made it; segments of two arenas (NUMA nodes) are made at
 * once by two threads. Of two segments published back to back after the
 * run's end, the second's grow may come before the first is in the map:
 * the first's grow must then take both, or every later segment falls
 * outside the run for good (and frees there go to the slower map).
 *
 * Two threads each publish one of the two boundaries after the run's end,
 * started together, with point segment_run (between the map and the
 * grow) held open by the harness, round after round until the point was
 * reached MIN_HITS times: after each round the run must reach past both.
 * The segments are stand-ins, a mapping with a segment's header magic,
 * as segment_create writes it before it publishes; nothing allocates from
 * them (no arena lists them), and they stay mapped, as segments do. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "base/segment_map.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <sys/mman.h>

#define MIN_HITS 24
#define MAX_ROUNDS 200

static pthread_barrier_t go;

typedef struct {
    uintptr_t at;
    bool mapped;
} stand_in;

static void *publish_stand_in(void *arg) {
    stand_in *s = arg;
    pthread_barrier_wait(&go);
    void *p = mmap((void *)s->at, LULL_SEGMENT_SIZE, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED_NOREPLACE, -1, 0);
    s->mapped = p == (void *)s->at;
    if (!s->mapped) {
        /* taken meanwhile (the reclaim thread's spare segment): no round */
        if (p != MAP_FAILED) munmap(p, LULL_SEGMENT_SIZE);
        return NULL;
    }
    ((lull_segment *)p)->magic = LULL_SEGMENT_MAGIC;
    lull_segment_publish((uintptr_t)p);
    return NULL;
}

static uintptr_t run_end(void) {
    return atomic_load(&lull_the_segment_run.lo) + atomic_load(&lull_the_segment_run.len);
}

Test(race, two_segments_published_at_once_both_join_the_segment_run) {
    lull_free(lull_malloc(16)); /* lull started: the run has its first segment */
    cr_assert_gt(atomic_load(&lull_the_segment_run.len), 0);
    lull_race_arm(1u << LULL_RACE_SEGMENT_RUN, 11, 2000);
    int rounds = 0, counted = 0;
    while (rounds < MAX_ROUNDS && lull_race_hits(LULL_RACE_SEGMENT_RUN) < MIN_HITS) {
        rounds++;
        uintptr_t end = run_end();
        stand_in s[2] = {{.at = end}, {.at = end + LULL_SEGMENT_SIZE}};
        pthread_t t[2];
        cr_assert_eq(pthread_barrier_init(&go, NULL, 2), 0);
        for (int k = 0; k < 2; k++)
            cr_assert_eq(pthread_create(&t[k], NULL, publish_stand_in, &s[k]), 0);
        for (int k = 0; k < 2; k++)
            pthread_join(t[k], NULL);
        pthread_barrier_destroy(&go);
        if (!s[0].mapped || !s[1].mapped) continue;
        counted++;
        cr_assert_geq(run_end(), end + 2 * LULL_SEGMENT_SIZE,
                      "round %d: the run ends at %#lx, before the second segment's end %#lx",
                      rounds, (unsigned long)run_end(),
                      (unsigned long)(end + 2 * LULL_SEGMENT_SIZE));
    }
    uint64_t hits = lull_race_hits(LULL_RACE_SEGMENT_RUN);
    lull_race_arm(0, 0, 0);
    cr_log_info("%d rounds (%d with both mapped), segment_run reached %llu times", rounds, counted,
                (unsigned long long)hits);
    cr_assert_geq(hits, MIN_HITS, "segment_run reached %llu times in %d rounds",
                  (unsigned long long)hits, rounds);
    cr_assert_gt(counted, 0);
}
