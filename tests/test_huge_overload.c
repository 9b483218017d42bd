/* Freed huge blocks under overload (issue 13, item 9): request threads
 * free huge blocks faster than the reclaim thread gives them back. The
 * backlog of freed mappings must stay bounded, and no request thread may
 * purge or unmap to bound it.
 *
 * Event-bounded: THREADS threads each run CYCLES cycles; a cycle picks one of
 * the thread's HELD slots (a seeded random walk) and frees the 20 MiB block
 * there after checking the pages it wrote, or mallocs one and writes a few
 * pages, then makes a few small allocations. So the number of live huge
 * blocks goes up and down, as in a server, and new mappings are made. With the
 * reclaim thread held (tests/support/reclaim_hold.h) nothing is unmapped at
 * all while they run, which is the reclaim thread at its slowest: mapped
 * bytes (lull_stats() total.mapped) must stay within the goal,
 * 4 x live + 1 GiB above what was mapped before, sampled every few cycles
 * by the workers themselves. The same with the reclaim thread running and
 * the syscall watch on the workers: no purge, unmap or io_uring call on
 * them. Each in-process with the default cache, and again in a new process
 * with LULL_CONF=huge_cache_mb=0 (every freed mapping goes to the queue).
 *
 * The scenario in a new process is this program run again with
 * LULL_TEST_HUGE_OVERLOAD set: a constructor runs it before Criterion
 * starts and prints its figures as key=value lines. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "reclaim/huge_queue.h"
#include "base/types.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/reexec.h"
#include "tests/support/syscall_watch.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MiB ((uint64_t)1 << 20)
#define GiB ((uint64_t)1 << 30)
#define PAGE ((size_t)4096)

#define THREADS 3
#define BLOCK ((size_t)20 << 20)
#define HELD 4           /* blocks a thread holds at most */
#define CYCLES 600       /* per thread: a malloc into an empty slot or a free of a full one */
#define SAMPLE_EVERY 4   /* cycles between two lull_stats() of a worker */
#define SMALL_BETWEEN 16 /* small allocations after each cycle */
/* the goal: mapped at most 4 x live + 1 GiB (live: HELD blocks per
 * thread at most) */
#define LIVE ((uint64_t)THREADS * HELD * BLOCK)
#define MAPPED_BOUND (4 * LIVE + GiB)

typedef struct {
    uint64_t ok;      /* 1: every block read back what its thread wrote */
    uint64_t held;    /* the reclaim thread was held throughout */
    uint64_t watched; /* the watch was installed on every worker */
    uint64_t purges;  /* watched calls (madvise, munmap, ...) on the workers */
    uint64_t base;    /* mapped before */
    uint64_t peak;    /* the largest mapped a worker saw */
    uint64_t end;     /* mapped after the workers, the reclaim thread free again */
    uint64_t reused;  /* huge allocations that took a freed mapping */
    uint64_t fresh;   /* ... that mapped a new one */
} overload_result;

#define FIELDS(X) X(ok) X(held) X(watched) X(purges) X(base) X(peak) X(end) X(reused) X(fresh)

static _Atomic uint64_t peak_mapped;
static atomic_int workers_ok, workers_watched;

static uint64_t mapped_now(void) {
    struct lull_counters c;
    if (lull_stats(&c) != 0) return UINT64_MAX;
    return c.total.mapped;
}

static void reuse_counts(uint64_t *reused, uint64_t *fresh) {
    struct lull_counters c;
    lull_stats(&c);
    *reused = *fresh = 0;
    for (uint64_t n = 0; n < c.node_count; n++) {
        *reused += c.nodes[n].huge_cache_hits;
        *fresh += c.nodes[n].huge_cache_misses;
    }
}

static void note_mapped(void) {
    uint64_t m = mapped_now(), seen = atomic_load(&peak_mapped);
    while (m > seen && !atomic_compare_exchange_weak(&peak_mapped, &seen, m)) {
    }
}

/* The first page, one in the middle and the last: each mapping costs a few
 * resident pages, as in the workload (whose blocks were barely
 * touched), so a pile-up shows in the address space long before it costs
 * the machine its memory. */
static void mark(char *p, uint64_t seed) {
    memcpy(p, &seed, sizeof seed);
    memcpy(p + BLOCK / 2, &seed, sizeof seed);
    memcpy(p + BLOCK - sizeof seed, &seed, sizeof seed);
}

static bool marked(const char *p, uint64_t seed) {
    uint64_t a, b, c;
    memcpy(&a, p, sizeof a);
    memcpy(&b, p + BLOCK / 2, sizeof b);
    memcpy(&c, p + BLOCK - sizeof c, sizeof c);
    return a == seed && b == seed && c == seed;
}

static uint64_t xorshift(uint64_t *x) {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    return *x;
}

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    bool watch = id >> 8;
    id &= 0xff;
    if (watch && syscall_watch_install_on_this_thread() == 0) atomic_fetch_add(&workers_watched, 1);
    bool ok = true;
    uint64_t x = 0x9e3779b97f4a7c15ULL * (id + 1), seed[HELD] = {0};
    char *held[HELD] = {0};
    for (int i = 0; i < CYCLES && ok; i++) {
        unsigned k = (unsigned)(xorshift(&x) % HELD);
        if (held[k]) {
            if (!marked(held[k], seed[k])) ok = false;
            lull_free(held[k]);
            held[k] = NULL;
        } else {
            held[k] = lull_malloc(BLOCK);
            if (!held[k]) {
                ok = false;
                break;
            }
            seed[k] = (uint64_t)id << 32 | (uint64_t)i;
            mark(held[k], seed[k]);
        }
        /* a mapping handed to two threads at once would show at the check */
        for (int j = 0; j < SMALL_BETWEEN; j++)
            lull_free(lull_malloc(16 + (size_t)j * 40));
        if (i % SAMPLE_EVERY == 0) note_mapped();
    }
    for (unsigned k = 0; k < HELD; k++)
        if (held[k]) {
            if (!marked(held[k], seed[k])) ok = false;
            lull_free(held[k]);
        }
    note_mapped();
    if (ok) atomic_fetch_add(&workers_ok, 1);
    if (watch) syscall_watch_thread_done();
    return NULL;
}

/* Runs the workload; with `held` the reclaim thread is held from before the
 * first cycle to after the last, with `watch` the workers are watched.
 * Usable before Criterion starts (no cr_ calls). */
static overload_result run_overload(bool held, bool watch) {
    overload_result r = {0};
    if (!lull_reclaim_now()) return r; /* no reclaim thread: ok stays 0 */
    /* what the first huge malloc sets up, before the baseline */
    lull_free(lull_malloc(BLOCK));
    lull_reclaim_now();
    if (watch && syscall_watch_start() != 0) return r;
    if (watch) syscall_watch_reset();
    uint64_t reused0, fresh0;
    reuse_counts(&reused0, &fresh0);
    r.base = mapped_now();
    atomic_store(&peak_mapped, r.base);
    atomic_store(&workers_ok, 0);
    atomic_store(&workers_watched, 0);
    if (held && !reclaim_hold()) return r;
    pthread_t t[THREADS];
    for (uintptr_t i = 0; i < THREADS; i++)
        if (pthread_create(&t[i], NULL, worker, (void *)((uintptr_t)watch << 8 | i)) != 0) return r;
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    r.held = held && reclaim_held();
    if (held && !reclaim_release()) return r;
    if (watch) {
        syscall_watch_sync(5000);
        r.purges = syscall_watch_count();
        if (r.purges) syscall_watch_dump(0);
    }
    r.watched = atomic_load(&workers_watched) == THREADS;
    r.peak = atomic_load(&peak_mapped);
    reuse_counts(&r.reused, &r.fresh);
    r.reused -= reused0;
    r.fresh -= fresh0;
    /* the reclaim thread gives the backlog back */
    lull_reclaim_now();
    lull_reclaim_now();
    r.end = mapped_now();
    r.ok = atomic_load(&workers_ok) == THREADS;
    return r;
}

__attribute__((constructor(200))) static void scenario_main(void) {
    const char *sc = getenv("LULL_TEST_HUGE_OVERLOAD");
    if (!sc) return;
    bool held = strcmp(sc, "held") == 0, watch = strcmp(sc, "watched") == 0;
    if (!held && !watch) {
        dprintf(1, "error=unknown scenario %s\n", sc);
        _exit(2);
    }
    overload_result r = run_overload(held, watch);
#define PRINT(f) dprintf(1, #f "=%llu\n", (unsigned long long)r.f);
    FIELDS(PRINT)
#undef PRINT
    _exit(0);
}

/* ---- the test side ------------------------------------------------------- */

#define MB(x) ((unsigned long long)(x) >> 20)

static void report(const char *what, const overload_result *r) {
    cr_log_info("%s: mapped %llu MiB before, peak %llu MiB (bound %llu MiB above), %llu MiB "
                "after; %llu huge allocations reused a freed mapping, %llu mapped one",
                what, MB(r->base), MB(r->peak), MB(MAPPED_BOUND), MB(r->end),
                (unsigned long long)r->reused, (unsigned long long)r->fresh);
}

static void check_bounded(const char *what, const overload_result *r) {
    cr_assert_eq(r->ok, 1,
                 "%s: a block's content changed, an allocation failed, or the "
                 "scenario could not run",
                 what);
    cr_assert_leq(r->peak - r->base, MAPPED_BOUND,
                  "%s: mapped grew by %llu MiB in %d huge malloc or free cycles, the bound is "
                  "%llu MiB (4 x %llu MiB live + 1 GiB); %llu reused, %llu mapped anew",
                  what, MB(r->peak - r->base), THREADS * CYCLES, MB(MAPPED_BOUND), MB(LIVE),
                  (unsigned long long)r->reused, (unsigned long long)r->fresh);
}

static overload_result run_child(const char *scenario, const char *conf) {
    static char conf_var[128], sc_var[128];
    snprintf(conf_var, sizeof conf_var, "LULL_CONF=%s", conf);
    snprintf(sc_var, sizeof sc_var, "LULL_TEST_HUGE_OVERLOAD=%s", scenario);
    const char *vars[] = {conf_var, sc_var, NULL};
    child_run cr;
    reexec_run("test_huge_overload_scenario", vars, scenario, 300000, &cr);
    reexec_assert_exited_0(&cr, scenario);
    overload_result r = {0};
#define GET(f) r.f = reexec_field(&cr, #f);
    FIELDS(GET)
#undef GET
    return r;
}

static void setup(void) {
    cr_assert(lull_configure("warm_reserve_mb", "0"));
}

Test(huge_overload, with_the_reclaim_thread_held_mapped_stays_bounded, .init = setup,
     .timeout = 300) {
    overload_result r = run_overload(true, false);
    report("held", &r);
    cr_assert_eq(r.held, 1, "the reclaim thread was not held");
    check_bounded("held", &r);
    /* released, the reclaim thread gives back what the cache does not keep */
    cr_assert_leq(r.end - r.base, GiB + 2 * LIVE, "%llu MiB still mapped above the start",
                  MB(r.end - r.base));
}

/* The cache full: a mapping freed then goes to the queue, and the next
 * huge malloc must find it there (held, nobody moves it into the cache). */
Test(huge_overload, with_a_cache_smaller_than_the_working_set_and_the_reclaim_thread_held,
     .init = setup, .timeout = 300) {
    cr_assert(lull_configure("huge_cache_mb", "100")); /* one 52 MiB mapping */
    overload_result r = run_overload(true, false);
    report("held, huge_cache_mb=100", &r);
    cr_assert_eq(r.held, 1, "the reclaim thread was not held");
    check_bounded("held, huge_cache_mb=100", &r);
    cr_assert_leq(r.end - r.base, 100 * MiB + 64 * MiB, "%llu MiB still mapped above the start",
                  MB(r.end - r.base));
}

Test(huge_overload, without_the_cache_and_the_reclaim_thread_held_mapped_stays_bounded,
     .timeout = 300) {
    overload_result r = run_child("held", "huge_cache_mb=0,warm_reserve_mb=0");
    report("held, huge_cache_mb=0", &r);
    cr_assert_eq(r.held, 1, "the reclaim thread was not held");
    check_bounded("held, huge_cache_mb=0", &r);
    /* nothing is kept: released, the reclaim thread unmaps the backlog */
    cr_assert_leq(r.end - r.base, 64 * MiB, "%llu MiB still mapped above the start",
                  MB(r.end - r.base));
}

Test(huge_overload, request_threads_never_purge_to_bound_the_backlog, .init = setup,
     .timeout = 300) {
    overload_result r = run_overload(false, true);
    report("watched", &r);
    cr_assert_eq(r.watched, 1, "the watch was not installed on every worker");
    cr_assert_eq(r.purges, 0, "%llu purge/unmap/io_uring calls on request threads",
                 (unsigned long long)r.purges);
    check_bounded("watched", &r);
}

Test(huge_overload, without_the_cache_request_threads_never_purge_to_bound_the_backlog,
     .timeout = 300) {
    overload_result r = run_child("watched", "huge_cache_mb=0,warm_reserve_mb=0");
    report("watched, huge_cache_mb=0", &r);
    cr_assert_eq(r.watched, 1, "the watch was not installed on every worker");
    cr_assert_eq(r.purges, 0, "%llu purge/unmap/io_uring calls on request threads",
                 (unsigned long long)r.purges);
    check_bounded("watched, huge_cache_mb=0", &r);
    cr_assert_leq(r.end - r.base, 64 * MiB, "%llu MiB still mapped above the start",
                  MB(r.end - r.base));
}

/* ---- the queue's ownership ----------------------------------------------- */

static lull_huge *header_of(const void *p) {
    return (lull_huge *)((uintptr_t)p & ~(uintptr_t)LULL_SEGMENT_MASK);
}

/* The queue slot that holds p's mapping, or false. */
static bool queued(const void *p, lull_huge_queue_entry *e) {
    for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++)
        if (lull_huge_queue_peek(i, e) && e->h == header_of(p)) return true;
    return false;
}

/* With the reclaim thread held, the claims are taken here by hand, as its
 * drain makes them: a mapping it has claimed is never handed out, and one
 * a malloc took back cannot be claimed any more (exactly one side wins). */
Test(huge_overload, a_queued_mapping_goes_to_exactly_one_of_a_malloc_and_the_reclaim_thread,
     .init = setup, .timeout = 60) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert(reclaim_hold());
    cr_assert(lull_configure("huge_cache_mb", "0")); /* the free goes to the queue */
    char *p = lull_malloc(BLOCK);
    cr_assert_not_null(p);
    mark(p, 1);
    lull_free(p);
    lull_huge_queue_entry e;
    cr_assert(queued(p, &e), "the freed mapping is not in the queue");
    cr_assert_geq(lull_huge_queue_bytes(), BLOCK);
    /* the cache would keep it now: a malloc may take it from the queue */
    cr_assert(lull_configure("huge_cache_mb", "1024"));

    /* the reclaim thread wins: no malloc gets the mapping */
    cr_assert(lull_huge_queue_claim(&e));
    cr_assert_not(lull_huge_queue_claim(&e), "a mapping was claimed twice");
    char *q = lull_malloc(BLOCK);
    cr_assert_not_null(q);
    cr_assert_neq(q, p, "a mapping the reclaim thread claimed was handed out");
    mark(q, 2);

    /* given back to the queue (the owner may): now a malloc wins, and the
     * reclaim thread's claim of it fails */
    lull_huge_queue_push(e.h);
    cr_assert(queued(p, &e));
    char *r = lull_malloc(BLOCK);
    cr_assert_eq(r, p, "the queued mapping was not taken back");
    cr_assert(marked(r, 1), "a dirty mapping taken back lost its contents");
    cr_assert_not(lull_huge_queue_claim(&e), "the reclaim thread claimed a mapping in use");
    cr_assert_not(queued(p, &e));
    cr_assert(marked(q, 2));
    lull_free(q);
    lull_free(r);
    cr_assert(reclaim_release());
    cr_assert(lull_reclaim_now());
}

/* A huge malloc that takes a mapping back from the queue makes no system
 * call at all (the watch sees every call but the vDSO clock fallbacks). */
static void *take_back_watched(void *arg) {
    size_t *calls = arg;
    static const long clocks[] = {SYS_clock_gettime, SYS_gettimeofday, SYS_time, SYS_getcpu};
    if (syscall_watch_install_all_but(clocks, 4) != 0) {
        *calls = SIZE_MAX;
        return NULL;
    }
    /* this thread's heap, and whatever a sanitizer sets up for a thread on
     * its first intercepted call, before the count */
    char tmp[16];
    char *s = lull_malloc(64);
    memcpy(s, "warm", 5);
    memcpy(tmp, s, 5);
    lull_free(s);
    size_t n0 = syscall_watch_count();
    char *p = lull_malloc(BLOCK);
    mark(p, 3);
    size_t n1 = syscall_watch_count();
    *calls = n1 - n0;
    syscall_watch_thread_done();
    lull_free(p);
    return NULL;
}

Test(huge_overload, a_malloc_takes_a_queued_mapping_back_without_a_system_call, .init = setup,
     .timeout = 60) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert_eq(syscall_watch_start(), 0, "seccomp user notification unavailable");
    /* the thread's heap and what a first huge malloc sets up */
    pthread_t t;
    size_t warm = 0;
    cr_assert_eq(pthread_create(&t, NULL, take_back_watched, &warm), 0);
    pthread_join(t, NULL);
    cr_assert(reclaim_hold());
    cr_assert(lull_configure("huge_cache_mb", "0"));
    char *p = lull_malloc(BLOCK);
    lull_free(p);
    lull_huge_queue_entry e;
    cr_assert(queued(p, &e));
    cr_assert(lull_configure("huge_cache_mb", "1024"));
    syscall_watch_reset();
    size_t calls = SIZE_MAX;
    cr_assert_eq(pthread_create(&t, NULL, take_back_watched, &calls), 0);
    pthread_join(t, NULL);
    if (calls) syscall_watch_dump(0);
    cr_assert_eq(calls, 0, "%zu system calls in a huge malloc served from the queue", calls);
    cr_assert_not(queued(p, &e), "the malloc did not take the queued mapping");
    cr_assert(reclaim_release());
    cr_assert(lull_reclaim_now());
}

/* More mappings queued than the queue has slots: the rest goes onto the
 * overflow stack, and the reclaim thread, let go, gives all of them back. */
#define MANY (LULL_HUGE_QUEUE_SLOTS + 8)

Test(huge_overload, the_reclaim_thread_drains_a_queue_that_overflowed, .init = setup,
     .timeout = 120) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert(lull_configure("huge_cache_mb", "0"));
    lull_free(lull_malloc(BLOCK));
    cr_assert(lull_reclaim_now());
    uint64_t base = mapped_now();
    cr_assert_eq(lull_huge_queue_bytes(), 0);
    static char *p[MANY];
    for (int i = 0; i < MANY; i++) {
        p[i] = lull_malloc(17 * MiB); /* 49 MiB of address space each */
        cr_assert_not_null(p[i]);
    }
    cr_assert(reclaim_hold());
    for (int i = 0; i < MANY; i++)
        lull_free(p[i]);
    unsigned in_slots = 0;
    lull_huge_queue_entry e;
    for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++)
        in_slots += lull_huge_queue_peek(i, &e);
    cr_assert_eq(in_slots, LULL_HUGE_QUEUE_SLOTS);
    cr_assert_geq(lull_huge_queue_bytes(), (uint64_t)MANY * 17 * MiB);
    cr_assert(reclaim_release());
    cr_assert(lull_reclaim_now());
    cr_assert_eq(lull_huge_queue_bytes(), 0, "%llu MiB still queued", MB(lull_huge_queue_bytes()));
    for (int i = 0; i < MANY; i++)
        cr_assert_not(lull_owns(p[i]), "mapping %d is still mapped", i);
    cr_assert_leq(mapped_now(), base + 8 * MiB, "mapped %llu MiB, %llu MiB before",
                  MB(mapped_now()), MB(base));
}
