/* Race harness: parked pages (numa/page_park.h, src/span_park.c). The owner
 * of an in-use span parks the pages that no live block overlaps when the
 * span thins out, and takes them back when it refills from the span or
 * releases it; the reclaim thread claims parked pages (PENDING -> PURGING),
 * purges them and finishes them (-> PURGED). Built only with -DLULL_RACE=ON
 * (base/race.h): the points between the claim and the purge (page_claim,
 * reclaim thread) and between the take-back and the re-threading of the
 * blocks (page_take_back, owner), and the span release, hold each window
 * open for a time drawn from a seed.
 *
 * The owner runs rounds: it fills SPANS spans of one class, writes a
 * pattern over every word of every block, frees all blocks but those that
 * start on one page in KEEP_EVERY (pages with no live block: the spans
 * park them as they thin), then allocates as many blocks again, which takes
 * the parked pages back, and writes patterns into the new blocks. A kicker
 * thread keeps the reclaim thread ticking all the time (purge delay 0), so
 * its claims race the owner's take-backs; in one round mode in four the
 * owner waits until it sees a page PURGING before it allocates, so that the
 * take-back meets a claim held open by page_claim. Then every live block
 * (survivors and new ones) must hold its pattern and no two may overlap;
 * once more after a tick has settled every purge in flight (a block handed
 * out on a page being purged is zero by then); and once more as each is
 * freed, which empties the spans (take-back on the release path, a span
 * with a PURGING page staying in its queue). A broken protocol (a PURGING
 * page taken back, a page with a live block parked or claimed) zeroes a
 * live block or hands a block out twice: a pattern breaks.
 *
 * Every shape runs until each armed point was reached MIN_HITS times and
 * the owner met a PURGING page MIN_MET times (at least MIN_ROUNDS rounds,
 * at most MAX_ROUNDS): bounded by events, not by time. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"
#include "numa/page_park.h"
#include "reclaim/reclaim.h"

#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MASK(p) (1u << (p))
#define SPANS 6      /* spans of the class a round fills */
#define KEEP_EVERY 4 /* blocks that start on one page in 4 survive */
#define MAX_BLOCKS 1024
#define MAX_LIVE (2 * MAX_BLOCKS)
#define MAX_SLICES 64 /* slices a round's blocks are on */
#define MIN_ROUNDS 1000
#define MAX_ROUNDS 6000
#define MIN_HITS 50
#define MIN_MET 200      /* rounds whose allocations met a PURGING page */
#define MAX_DELAY_US 300 /* a held window: up to 300 us */
#define MEET_POLLS 20000 /* bound of the wait for a claim */
#define NAP_MAX_US 200

typedef struct {
    const char *name;
    size_t block;      /* a class size: blocks of it are exactly that far apart */
    unsigned per_span; /* blocks of its 64 KiB span */
} shape;

/* 4 KiB: one block a page; 1 KiB: four; 3 KiB: blocks that straddle two
 * pages (a block over a taken page and a PURGING one stays off the list) */
static const shape page_blocks = {"4 KiB", 4096, 16};
static const shape quarter_blocks = {"1 KiB", 1024, 64};
static const shape straddling_blocks = {"3 KiB", 3072, 21};

static const uint32_t armed =
    MASK(LULL_RACE_PAGE_CLAIM) | MASK(LULL_RACE_PAGE_TAKE_BACK) | MASK(LULL_RACE_SPAN_RELEASE);

/* ---- the kicker: the reclaim thread ticks all the time ------------------ */

static struct {
    pthread_t thread;
    _Atomic bool stop;
    _Atomic uint64_t ticks;
} kick;

static void *kicker(void *arg) {
    uint64_t rng = (uint64_t)(uintptr_t)arg | 1;
    while (!atomic_load(&kick.stop)) {
        lull_reclaim_now();
        atomic_fetch_add(&kick.ticks, 1);
        uint64_t r = rng_next(&rng);
        if (r % 4 == 0) { /* a short nap now and then: the ticks' phase moves */
            struct timespec t = {0, (long)(r >> 8) % 50000};
            nanosleep(&t, NULL);
        }
    }
    return NULL;
}

/* ---- blocks and their patterns ------------------------------------------ */

typedef struct {
    uint8_t *p;
    uint64_t seed;
} live_block;

static live_block live[MAX_LIVE];
static size_t nlive;

/* every word of the block, from its address, a seed and its index */
static uint64_t pat_word(const void *p, uint64_t seed, size_t i) {
    return mix64((uintptr_t)p ^ seed ^ ((uint64_t)i * 0x9E3779B97F4A7C15ULL)) | 1; /* never 0 */
}

static void fill_block(void *p, size_t size, uint64_t seed) {
    uint64_t *w = p;
    for (size_t i = 0; i < size / 8; i++)
        w[i] = pat_word(p, seed, i);
}

static uint32_t page_state_of(const void *p) {
    const lull_segment *seg = (const lull_segment *)((uintptr_t)p & ~LULL_SEGMENT_MASK);
    uintptr_t off = (uintptr_t)p & LULL_SEGMENT_MASK;
    uint32_t word = lull_pages_word(seg, (unsigned)(off >> LULL_SLICE_SHIFT));
    return word >> (2 * ((off >> 12) % LULL_PAGES_PER_SLICE)) & 3;
}

static const char *const state_names[] = {"NONE", "PENDING", "PURGING", "PURGED"};

/* Fails the test, naming the block, the first bad word and the state of its
 * page, if the block does not hold its pattern. */
static void check_block(const shape *sh, const live_block *b, int round, const char *when) {
    const uint64_t *w = (const uint64_t *)b->p;
    for (size_t i = 0; i < sh->block / 8; i++) {
        uint64_t want = pat_word(b->p, b->seed, i);
        if (w[i] == want) continue;
        size_t zero = 0;
        for (size_t j = i; j < sh->block / 8 && !w[j]; j++)
            zero++;
        const void *at = w + i;
        cr_assert_fail("%s, round %d, %s: block %p lost its pattern at byte %zu (%p, page %s): "
                       "%#llx, want %#llx; %s",
                       sh->name, round, when, (void *)b->p, i * 8, at,
                       state_names[page_state_of(at)], (unsigned long long)w[i],
                       (unsigned long long)want,
                       zero ? "zeroed (purged while live)" : "overwritten (handed out twice?)");
    }
}

static int by_address(const void *a, const void *b) {
    uintptr_t x = (uintptr_t)((const live_block *)a)->p, y = (uintptr_t)((const live_block *)b)->p;
    return x < y ? -1 : x > y;
}

/* Every live block holds its pattern and none overlaps the next. */
static void check_all(const shape *sh, int round, const char *when) {
    for (size_t i = 0; i < nlive; i++)
        check_block(sh, &live[i], round, when);
    live_block sorted[MAX_LIVE];
    memcpy(sorted, live, nlive * sizeof *live);
    qsort(sorted, nlive, sizeof *sorted, by_address);
    for (size_t i = 1; i < nlive; i++)
        if (sorted[i].p < sorted[i - 1].p + sh->block)
            cr_assert_fail("%s, round %d, %s: blocks %p and %p (%zu B) overlap", sh->name, round,
                           when, (void *)sorted[i - 1].p, (void *)sorted[i].p, sh->block);
}

static void alloc_one(const shape *sh, uint64_t seed) {
    cr_assert_lt(nlive, (size_t)MAX_LIVE);
    uint8_t *p = lull_malloc(sh->block);
    cr_assert_not_null(p);
    live[nlive] = (live_block){p, seed};
    fill_block(p, sh->block, seed);
    nlive++;
}

static void shuffle(live_block *a, size_t n, uint64_t *rng) {
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)(rng_next(rng) % i);
        live_block t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* ---- the slices of a round's blocks, and their pages' states ------------ */

typedef struct {
    const lull_segment *seg;
    unsigned slice;
} slice_ref;

static slice_ref slices[MAX_SLICES];
static size_t nslices;

static void note_slices(void) {
    nslices = 0;
    for (size_t i = 0; i < nlive; i++) {
        const lull_segment *seg = (const lull_segment *)((uintptr_t)live[i].p & ~LULL_SEGMENT_MASK);
        unsigned slice = (unsigned)(((uintptr_t)live[i].p & LULL_SEGMENT_MASK) >> LULL_SLICE_SHIFT);
        size_t k = 0;
        while (k < nslices && !(slices[k].seg == seg && slices[k].slice == slice))
            k++;
        if (k == nslices && nslices < MAX_SLICES) slices[nslices++] = (slice_ref){seg, slice};
    }
}

/* pages of the round's slices in `state` */
static unsigned pages_in_state(uint32_t state) {
    unsigned n = 0;
    for (size_t k = 0; k < nslices; k++)
        n += (unsigned)__builtin_popcount(
            lull_pages_in(lull_pages_word(slices[k].seg, slices[k].slice), state));
    return n;
}

/* Wait until the reclaim thread claims a page of the round's spans (true),
 * or none is left to claim (false). */
static bool wait_for_a_claim(void) {
    for (int i = 0; i < MEET_POLLS; i++) {
        if (pages_in_state(LULL_PAGE_PURGING)) return true;
        if (!pages_in_state(LULL_PAGE_PENDING)) return false;
        sched_yield();
    }
    return false;
}

/* ---- the scenario -------------------------------------------------------- */

enum { MODE_STRAIGHT, MODE_NAP, MODE_MEET, MODE_SETTLED, MODES };

typedef struct {
    int rounds;
    unsigned met;     /* rounds whose allocations started with a page PURGING */
    unsigned settled; /* rounds whose allocations took back PURGED pages */
} tally;

static void round_of(const shape *sh, int round, uint64_t *rng, tally *t) {
    uint64_t seed = (uint64_t)round << 32;
    unsigned n = SPANS * sh->per_span + 1; /* the last refill puts the 6th span on the full list */
    cr_assert_leq(n, MAX_BLOCKS);
    nlive = 0;
    for (unsigned i = 0; i < n; i++)
        alloc_one(sh, seed + i);
    note_slices();

    /* free all but the blocks that start on one page in KEEP_EVERY, in a
     * random order: the full spans thin, and park what no live block holds */
    unsigned keep = (unsigned)round % KEEP_EVERY;
    shuffle(live, nlive, rng);
    size_t kept = 0, freed = 0;
    for (size_t i = 0; i < nlive; i++) {
        if (((uintptr_t)live[i].p >> 12) % KEEP_EVERY == keep) {
            live[kept++] = live[i];
            continue;
        }
        check_block(sh, &live[i], round, "before its first free");
        lull_free(live[i].p);
        freed++;
    }
    nlive = kept;

    /* the reclaim thread claims and purges what was parked, at once or not
     * yet: the allocations below take back what it has not claimed */
    int mode = (int)(rng_next(rng) % MODES);
    if (mode == MODE_NAP) {
        struct timespec ts = {0, (long)(rng_next(rng) % (NAP_MAX_US * 1000))};
        nanosleep(&ts, NULL);
    } else if (mode == MODE_MEET) {
        if (wait_for_a_claim()) t->met++;
    } else if (mode == MODE_SETTLED) {
        lull_reclaim_now();
        if (pages_in_state(LULL_PAGE_PURGED)) t->settled++;
    }
    for (size_t i = 0; i < freed; i++)
        alloc_one(sh, seed + n + i);
    check_all(sh, round, "after the refill");

    /* a tick that started after this call has run: every purge claimed
     * before it is done, and a block handed out on a page it purged is zero */
    lull_reclaim_now();
    check_all(sh, round, "after a tick");

    /* empty the spans: parks as they thin, take-backs before release */
    shuffle(live, nlive, rng);
    for (size_t i = 0; i < nlive; i++) {
        check_block(sh, &live[i], round, "before its last free");
        lull_free(live[i].p);
    }
    nlive = 0;
    t->rounds++;
}

static bool hits_reached(void) {
    for (int p = 0; p < LULL_RACE_COUNT; p++)
        if ((armed & MASK(p)) && lull_race_hits((lull_race_point_id)p) < MIN_HITS) return false;
    return true;
}

static void run_shape(const shape *sh, uint64_t seed) {
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_reclaim_stats before;
    lull_reclaim_get_stats(&before);

    atomic_store(&kick.stop, false);
    cr_assert_eq(pthread_create(&kick.thread, NULL, kicker, (void *)(uintptr_t)seed), 0);
    lull_race_arm(armed, seed, MAX_DELAY_US);
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);

    uint64_t rng = seed;
    tally t = {0};
    for (int round = 0; round < MAX_ROUNDS; round++) {
        if (round >= MIN_ROUNDS && hits_reached() && t.met >= MIN_MET) break;
        round_of(sh, round, &rng, &t);
    }

    uint64_t hits[LULL_RACE_COUNT];
    for (int p = 0; p < LULL_RACE_COUNT; p++)
        hits[p] = lull_race_hits((lull_race_point_id)p);
    bool reached = hits_reached();
    lull_race_arm(0, 0, 0);
    atomic_store(&kick.stop, true);
    pthread_join(kick.thread, NULL);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    lull_reclaim_now();
    lull_reclaim_stats after;
    lull_reclaim_get_stats(&after);
    uint64_t purged = after.page_purged_bytes - before.page_purged_bytes;

    cr_log_info("%s: %d rounds in %.1f s, %llu ticks; page_claim=%llu page_take_back=%llu "
                "span_release=%llu; met PURGING %u, took back PURGED %u; %llu KiB of pages purged",
                sh->name, t.rounds,
                (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9,
                (unsigned long long)atomic_load(&kick.ticks),
                (unsigned long long)hits[LULL_RACE_PAGE_CLAIM],
                (unsigned long long)hits[LULL_RACE_PAGE_TAKE_BACK],
                (unsigned long long)hits[LULL_RACE_SPAN_RELEASE], t.met, t.settled,
                (unsigned long long)(purged >> 10));
    cr_assert(reached,
              "%s: not every point was reached %d times in %d rounds (page_claim %llu, "
              "page_take_back %llu, span_release %llu)",
              sh->name, MIN_HITS, t.rounds, (unsigned long long)hits[LULL_RACE_PAGE_CLAIM],
              (unsigned long long)hits[LULL_RACE_PAGE_TAKE_BACK],
              (unsigned long long)hits[LULL_RACE_SPAN_RELEASE]);
    cr_assert_geq(t.met, MIN_MET, "%s: the refill met a PURGING page in %u of %d rounds only",
                  sh->name, t.met, t.rounds);
    cr_assert_gt(t.settled, 0, "%s: no refill took back a PURGED page", sh->name);
    cr_assert_gt(purged, 0, "%s: the reclaim thread purged no parked page", sh->name);
}

Test(race_pages, one_block_a_page, .timeout = 120) {
    run_shape(&page_blocks, 0x5eed9a01);
}

Test(race_pages, four_blocks_a_page, .timeout = 120) {
    run_shape(&quarter_blocks, 0x5eed9a02);
}

Test(race_pages, blocks_across_pages, .timeout = 120) {
    run_shape(&straddling_blocks, 0x5eed9a03);
}
