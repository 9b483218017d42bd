/* The race harness's scheduling points; see race.h. Only a -DLULL_RACE=ON
 * build has them. A point never allocates and never takes a lock: it runs
 * inside malloc, free, the reclaim thread and the fork handlers. */
#ifdef LULL_RACE
#define _GNU_SOURCE
#include "base/race.h"

#include <sched.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

static _Atomic uint32_t armed_mask;
static _Atomic uint64_t armed_seed;
static _Atomic unsigned armed_delay_us;
static _Atomic uint64_t hits[LULL_RACE_COUNT];
static __thread uint64_t rng_state;
static __thread uint64_t rng_seed; /* the seed rng_state was drawn from */

static const char *const names[LULL_RACE_COUNT] = {
    [LULL_RACE_REMOTE_PUSH] = "remote_push",
    [LULL_RACE_REMOTE_QUEUE] = "remote_queue",
    [LULL_RACE_COLLECT] = "collect",
    [LULL_RACE_SPAN_RELEASE] = "span_release",
    [LULL_RACE_ABANDON] = "abandon",
    [LULL_RACE_ADOPT] = "adopt",
    [LULL_RACE_RECLAIM_CLAIM] = "reclaim_claim",
    [LULL_RACE_RECLAIM_PURGE] = "reclaim_purge",
    [LULL_RACE_RECLAIM_FINISH] = "reclaim_finish",
    [LULL_RACE_FORK] = "fork",
    [LULL_RACE_OUTBOX_SEND] = "outbox_send",
    [LULL_RACE_INBOX_APPLY] = "inbox_apply",
    [LULL_RACE_PAGE_CLAIM] = "page_claim",
    [LULL_RACE_PAGE_TAKE_BACK] = "page_take_back",
    [LULL_RACE_MODULE_START] = "module_start",
    [LULL_RACE_SEGMENT_NEW] = "segment_new",
    [LULL_RACE_SEGMENT_RUN] = "segment_run",
    [LULL_RACE_RECLAIM_OPEN] = "reclaim_open",
    [LULL_RACE_CORE_INIT] = "core_init",
    [LULL_RACE_COUNTER_PAGE_OPEN] = "counter_page_open",
    [LULL_RACE_COUNTER_PAGE_SWEEP] = "counter_page_sweep",
    [LULL_RACE_HUGE_TAKE_ALIGNED] = "huge_take_aligned",
    [LULL_RACE_HUGE_TAKE_ALL] = "huge_take_all",
    [LULL_RACE_HUGE_TAIL_PUSH] = "huge_tail_push",
};

const char *lull_race_point_name(lull_race_point_id p) {
    return p < LULL_RACE_COUNT ? names[p] : "?";
}

void lull_race_arm(uint32_t mask, uint64_t seed, unsigned max_delay_us) {
    atomic_store(&armed_mask, 0);
    for (int i = 0; i < LULL_RACE_COUNT; i++)
        atomic_store(&hits[i], 0);
    atomic_store(&armed_seed, seed);
    atomic_store(&armed_delay_us, max_delay_us);
    atomic_store(&armed_mask, mask);
}

uint64_t lull_race_hits(lull_race_point_id p) {
    return p < LULL_RACE_COUNT ? atomic_load(&hits[p]) : 0;
}

/* xorshift64*, seeded per thread from the armed seed and the thread id, so
 * that a seed replays the same choices on each thread */
static uint64_t next_random(void) {
    uint64_t seed = atomic_load_explicit(&armed_seed, memory_order_relaxed);
    if (rng_seed != seed || rng_state == 0) {
        rng_seed = seed;
        rng_state = (seed ^ ((uint64_t)gettid() * 0x9e3779b97f4a7c15ULL)) | 1;
    }
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return rng_state * 0x2545f4914f6cdd1dULL;
}

void lull_race_point(lull_race_point_id p) {
    uint32_t mask = atomic_load_explicit(&armed_mask, memory_order_relaxed);
    if (!(mask & (1u << p))) return;
    atomic_fetch_add_explicit(&hits[p], 1, memory_order_relaxed);
    uint64_t r = next_random();
    unsigned max_us = atomic_load_explicit(&armed_delay_us, memory_order_relaxed);
    switch (r & 3) {
    case 0: /* run straight through: the window closes at once */
        break;
    case 1:
        sched_yield();
        break;
    default: { /* hold the window open */
        unsigned us = max_us ? (unsigned)((r >> 8) % max_us) + 1 : 1;
        struct timespec t = {0, (long)us * 1000};
        nanosleep(&t, NULL);
        break;
    }
    }
}
#else
typedef int lull_race_unused; /* ISO C wants a translation unit to declare something */
#endif
