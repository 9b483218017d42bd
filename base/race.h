/* Scheduling points for the race harness (tests/test_race_*.c).
 *
 * Every protocol between threads (remote free, the owner's collection, span
 * release, heap abandon and adopt, the reclaim claim/purge/finish, fork) has
 * windows between its atomic steps. A test that only runs the protocol hits
 * those windows by luck; with -DLULL_RACE=ON each step calls
 * lull_race_point(), which, for the points a test armed, yields or sleeps
 * for a time drawn from the test's seed, so every window is held open and
 * the other thread's step lands inside it. Without LULL_RACE the points
 * compile to nothing. */
#ifndef LULL_RACE_H
#define LULL_RACE_H

#include <stdint.h>

typedef enum {
    LULL_RACE_REMOTE_PUSH,    /* remote free: the block is about to be pushed */
    LULL_RACE_REMOTE_QUEUE,   /* remote free: pushed, the span not yet on the owner's stack */
    LULL_RACE_COLLECT,        /* owner: a span's remote list taken, not yet merged */
    LULL_RACE_SPAN_RELEASE,   /* owner: a span found empty, about to go to its arena */
    LULL_RACE_ABANDON,        /* thread exit: heap collected, not yet on the abandoned list */
    LULL_RACE_ADOPT,          /* a heap taken from the abandoned list, not yet in use */
    LULL_RACE_RECLAIM_CLAIM,  /* reclaim: dirty bits taken, purging bits not yet set */
    LULL_RACE_RECLAIM_PURGE,  /* reclaim: runs claimed, the purge not yet issued */
    LULL_RACE_RECLAIM_FINISH, /* reclaim: target map set, purging bits not yet cleared */
    LULL_RACE_FORK,           /* fork: inside the prepare handler */
    LULL_RACE_OUTBOX_SEND,    /* remote free: a message about to be pushed on its owner's inbox */
    LULL_RACE_INBOX_APPLY,    /* owner: a message taken from the inbox, not yet applied */
    LULL_RACE_PAGE_CLAIM,     /* reclaim: parked pages claimed (PURGING), not yet purged */
    LULL_RACE_PAGE_TAKE_BACK, /* owner: parked pages taken back, their blocks not yet threaded */
    LULL_RACE_MODULE_START,   /* the first allocation: the modules starting, not yet started */
    LULL_RACE_SEGMENT_NEW,    /* a new segment published, its first span not yet claimed */
    LULL_RACE_SEGMENT_RUN,    /* a new segment set in the map, the segment run not yet grown */
    LULL_RACE_RECLAIM_OPEN,   /* reclaim thread: a descriptor of its backend or refault monitor
                               * opened, not yet recorded where a fork child closes it */
    LULL_RACE_CORE_INIT,      /* the first allocation: the core initialising, not yet done */
    LULL_RACE_COUNTER_PAGE_OPEN,  /* counter page: created, locked and mapped, its descriptor
                                   * not yet closed nor the mapping kept from fork children */
    LULL_RACE_COUNTER_PAGE_SWEEP, /* counter page sweep: a page opened to judge it, not yet
                                   * closed */
    LULL_RACE_HUGE_TAKE_ALIGNED,  /* an aligned huge malloc: the overflow of freed mappings
                                   * taken whole, the rest not yet given back */
    LULL_RACE_HUGE_TAKE_ALL,      /* a huge malloc with no reclaim thread: every queued
                                   * mapping taken, those it does not keep not yet given back */
    LULL_RACE_HUGE_TAIL_PUSH,     /* a huge realloc's shrunk tail counted as held, not yet
                                   * on the tails' stack */
    LULL_RACE_COUNT
} lull_race_point_id;

#ifdef LULL_RACE
/* Arm the points in `mask` (bit i: point i) with delays drawn from `seed`
 * of up to `max_delay_us` microseconds; mask 0 disarms. */
void lull_race_arm(uint32_t mask, uint64_t seed, unsigned max_delay_us);
/* Times each point was reached since the last lull_race_arm(). */
uint64_t lull_race_hits(lull_race_point_id p);
const char *lull_race_point_name(lull_race_point_id p);
void lull_race_point(lull_race_point_id p);
#define LULL_RACE_POINT(p) lull_race_point(p)
#else
#define LULL_RACE_POINT(p) ((void)0)
#endif

#endif
