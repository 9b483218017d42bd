/* The reclaim thread (reclaim/reclaim_thread.c) gives freed memory back:
 * with a purge delay of 0, RSS falls back after 256 MiB of 64 KiB blocks or
 * one 256 MiB huge block are freed; with a delay of "never" (or one longer
 * than the test) the memory is kept, which shows the first check can fail;
 * and no live block is ever zeroed by a purge while threads allocate, free
 * and reallocate and lull_reclaim_now() runs in a loop.
 *
 * The RSS checks use purge_mode=dontneed (MADV_FREE pages stay resident
 * until the kernel needs them) and warm_reserve_mb=0 (the warm reserve keeps
 * prefaulted memory on purpose). */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/reclaim.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define PAGE ((size_t)4096)

#ifdef LULL_SANITIZED
#define SCALE 3
#if defined(__SANITIZE_THREAD__)
/* ThreadSanitizer's shadow of the memory the test touched stays resident:
 * 16 bytes per 8-byte cell, so touch()'s one byte per page (and the last
 * one) makes one shadow page per page and one more per block. It is the
 * sanitizer's, not lull's: TSan does not see lull's purges (madvise through
 * io_uring by default). resident_in_blocks() still checks lull's memory. */
#define SHADOW(bytes) ((bytes) + (bytes) / 8)
#else
/* AddressSanitizer's shadow of the memory the test touched (1/8 of it) may
 * stay resident: it is the sanitizer's, not lull's */
#define SHADOW(bytes) ((bytes) / 8)
#endif
#else
#define SCALE 1
#define SHADOW(bytes) ((size_t)0)
#endif

static size_t rss_bytes(void) {
    FILE *f = fopen("/proc/self/statm", "r");
    cr_assert_not_null(f);
    unsigned long size, resident;
    cr_assert_eq(fscanf(f, "%lu %lu", &size, &resident), 2);
    fclose(f);
    return (size_t)resident * (size_t)sysconf(_SC_PAGESIZE);
}

static void setup_rss(void) {
    cr_assert(lull_configure("purge_mode", "dontneed"));
    cr_assert(lull_configure("warm_reserve_mb", "0"));
    lull_set_purge_delay_ms(0);
    void *p = lull_malloc(64);
    lull_free(p);
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    cr_assert(lull_reclaim_now());
}

static void touch(void *p, size_t len, unsigned char v) {
    volatile unsigned char *b = p;
    for (size_t i = 0; i < len; i += PAGE)
        b[i] = v;
    b[len - 1] = v;
}

#define BLOCK (64 * KiB)
#define TOTAL (256 * MiB)
#define NBLOCKS (TOTAL / BLOCK)

static void *blocks[NBLOCKS];

/* Allocate and touch `total` bytes in 64 KiB blocks; returns RSS after. */
static size_t alloc_blocks(size_t total) {
    for (size_t i = 0; i < total / BLOCK; i++) {
        blocks[i] = lull_malloc(BLOCK);
        cr_assert_not_null(blocks[i]);
        touch(blocks[i], BLOCK, (unsigned char)(i | 1));
    }
    return rss_bytes();
}

static void free_blocks(size_t total) {
    for (size_t i = 0; i < total / BLOCK; i++) {
        cr_assert_eq(((unsigned char *)blocks[i])[BLOCK - 1], (unsigned char)(i | 1));
        lull_free(blocks[i]);
    }
}

/* Resident bytes of the freed blocks' addresses (mincore): lull's memory
 * alone, whatever else the process holds. */
static size_t resident_in_blocks(size_t total) {
    static unsigned char vec[BLOCK / PAGE];
    size_t pages = 0;
    for (size_t i = 0; i < total / BLOCK; i++) {
        if (mincore(blocks[i], BLOCK, vec) != 0) continue; /* unmapped */
        for (size_t k = 0; k < BLOCK / PAGE; k++)
            pages += vec[k] & 1;
    }
    return pages * PAGE;
}

Test(reclaim, rss_falls_after_64KiB_blocks_are_freed, .init = setup_rss, .timeout = 120) {
    size_t before = rss_bytes();
    size_t peak = alloc_blocks(TOTAL);
    cr_assert_geq(peak, before + TOTAL * 9 / 10, "touching 256 MiB raised RSS only %zu -> %zu",
                  before, peak);
    cr_assert_geq(resident_in_blocks(TOTAL), TOTAL * 9 / 10);
    free_blocks(TOTAL);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    size_t after = rss_bytes();
    size_t bound = before + TOTAL / 20 + 8 * MiB + SHADOW(TOTAL);
    size_t left = resident_in_blocks(TOTAL);
    cr_log_info("RSS %zu MiB -> %zu MiB -> %zu MiB; %zu KiB of the blocks resident", before >> 20,
                peak >> 20, after >> 20, left >> 10);
    cr_assert_leq(after, bound, "RSS %zu MiB after freeing (before %zu MiB, bound %zu MiB)",
                  after >> 20, before >> 20, bound >> 20);
    /* of the freed blocks themselves, at most the span a heap keeps per
     * class stays resident */
    cr_assert_leq(left, TOTAL / 20, "%zu KiB of the freed blocks still resident", left >> 10);
}

Test(reclaim, rss_falls_after_a_huge_block_is_freed, .init = setup_rss, .timeout = 120) {
    size_t before = rss_bytes();
    void *p = lull_malloc(TOTAL);
    cr_assert_not_null(p);
    touch(p, TOTAL, 7);
    size_t peak = rss_bytes();
    cr_assert_geq(peak, before + TOTAL * 9 / 10);
    lull_free(p);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    size_t after = rss_bytes();
    size_t bound = before + TOTAL / 20 + 8 * MiB + SHADOW(TOTAL);
    cr_log_info("RSS %zu MiB -> %zu MiB -> %zu MiB", before >> 20, peak >> 20, after >> 20);
    cr_assert_leq(after, bound, "RSS %zu MiB after freeing (before %zu MiB, bound %zu MiB)",
                  after >> 20, before >> 20, bound >> 20);
    /* unmapped, or kept in the reclaim thread's cache purged: either way
     * none of it resident (mincore fails on an unmapped range) */
    static unsigned char vec[TOTAL / PAGE];
    size_t resident = 0;
    if (mincore(p, TOTAL, vec) == 0)
        for (size_t k = 0; k < TOTAL / PAGE; k++)
            resident += vec[k] & 1;
    cr_assert_eq(resident, 0, "%zu pages of the freed huge block still resident", resident);
}

/* The counter-test: with a delay the test never reaches, and with "never",
 * the freed memory stays resident; switched to 0, the same memory goes. */
Test(reclaim, rss_stays_while_the_delay_says_keep, .init = setup_rss, .timeout = 120) {
    const size_t total = 128 * MiB;
    lull_set_purge_delay_ms(600000);
    size_t before = rss_bytes();
    size_t peak = alloc_blocks(total);
    cr_assert_geq(peak, before + total * 9 / 10);
    free_blocks(total);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    size_t kept_long = rss_bytes();
    cr_assert_geq(resident_in_blocks(total), total * 9 / 10);
    lull_set_purge_delay_ms(-1);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    size_t kept_never = rss_bytes();
    lull_set_purge_delay_ms(0);
    cr_assert(lull_reclaim_now());
    cr_assert(lull_reclaim_now());
    size_t after = rss_bytes();
    cr_log_info("RSS %zu MiB -> %zu MiB; kept %zu / %zu MiB; then %zu MiB", before >> 20,
                peak >> 20, kept_long >> 20, kept_never >> 20, after >> 20);
    cr_assert_geq(kept_long, before + total * 9 / 10, "purged although the delay is 10 minutes");
    cr_assert_geq(kept_never, before + total * 9 / 10, "purged although the delay is never");
    cr_assert_leq(after, before + total / 20 + 8 * MiB + SHADOW(total),
                  "not purged after the delay went to 0");
    cr_assert_leq(resident_in_blocks(total), total / 20);
}

/* ---- no live block is zeroed by a purge --------------------------------- */

#define LIVE 24
#define ITERS (4000 / SCALE)
/* The workers run at least ITERS steps and until the reclaimer has made
 * MIN_CALLS calls and purged MIN_RUNS runs while they ran: a fixed number of
 * steps raced the reclaimer, and a fast machine finished them after one
 * call. MAX_ITERS only ends a run whose reclaimer never gets there. */
#define MIN_CALLS 20ul
#define MIN_RUNS 10u
#define MAX_ITERS (ITERS * 1000)

static atomic_bool live_stop, live_failed;
static char live_msg[256];
static atomic_ulong reclaim_calls;

static uint64_t mix(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ULL;
    x ^= x >> 27;
    return x | 1; /* never zero: a zeroed word never matches */
}

/* One word per 64 bytes, one per 4 pages above 64 KiB (page faults cost tens
 * of microseconds in some VMs, and purged pages fault again). */
static size_t live_step(size_t size) {
    return size <= 64 * KiB ? 64 : 16 * KiB;
}

static void live_fill(uint64_t *p, size_t size, uint64_t seed) {
    for (size_t off = 0; off + 8 <= size; off += live_step(size))
        p[off / 8] = mix((uintptr_t)p ^ seed ^ off);
}

static bool live_check(const uint64_t *p, const void *orig, size_t size, size_t keep,
                       uint64_t seed) {
    for (size_t off = 0; off + 8 <= size && off + 8 <= keep; off += live_step(size))
        if (p[off / 8] != mix((uintptr_t)orig ^ seed ^ off)) {
            snprintf(live_msg, sizeof live_msg, "%zu-byte block %p: word at %zu is %#lx", size,
                     (const void *)p, off, (unsigned long)p[off / 8]);
            return false;
        }
    return true;
}

static size_t live_size(uint64_t r) {
    switch (r % 64) {
    case 0:
        return 20 * MiB; /* huge */
    case 1 ... 8:
        return 64 * KiB;
    case 9 ... 16:
        return 192 * KiB;
    case 17 ... 24:
        return 1 * MiB + (r >> 8) % (3 * MiB); /* large */
    default:
        return 100 + (r >> 8) % 8000;
    }
}

static lull_reclaim_stats live_start;

/* Enough purging has happened while the workers ran: the reclaimer's calls,
 * purge runs, and a huge block freed or purged. */
static bool reclaim_seen_enough(void) {
    lull_reclaim_stats now;
    lull_reclaim_get_stats(&now);
    return atomic_load(&reclaim_calls) > MIN_CALLS &&
           now.purge_runs - live_start.purge_runs > MIN_RUNS &&
           (now.huge_freed - live_start.huge_freed) +
                   (now.huge_purged_bytes - live_start.huge_purged_bytes) >
               0;
}

static void *live_worker(void *arg) {
    uint64_t x = 0x2545f4914f6cdd1dULL * (uint64_t)(uintptr_t)arg;
    uint64_t *p[LIVE] = {0};
    size_t sz[LIVE] = {0};
    uint64_t sd[LIVE] = {0};
    for (int it = 0; (it < ITERS || (it % 64 != 0 || !reclaim_seen_enough())) && it < MAX_ITERS &&
                     !atomic_load(&live_failed);
         it++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        unsigned i = (unsigned)(x % LIVE);
        if (p[i] && x % 3 == 0) { /* realloc: contents move or stay */
            size_t nsz = live_size(x >> 3);
            if (nsz == 20 * MiB) nsz = 64 * KiB;
            uint64_t *q = lull_realloc(p[i], nsz);
            if (!q) {
                atomic_store(&live_failed, true);
                break;
            }
            size_t keep = nsz < sz[i] ? nsz : sz[i];
            /* the old pattern survives in what was kept */
            if (!live_check(q, p[i], sz[i], keep, sd[i])) {
                atomic_store(&live_failed, true);
                break;
            }
            p[i] = q;
            sz[i] = nsz;
            sd[i] = x;
            live_fill(q, nsz, x);
            continue;
        }
        if (p[i]) {
            if (!live_check(p[i], p[i], sz[i], sz[i], sd[i])) {
                atomic_store(&live_failed, true);
                break;
            }
            lull_free(p[i]);
        }
        sz[i] = live_size(x >> 3);
        p[i] = lull_malloc(sz[i]);
        if (!p[i]) {
            atomic_store(&live_failed, true);
            break;
        }
        sd[i] = x;
        live_fill(p[i], sz[i], x);
    }
    for (unsigned i = 0; i < LIVE; i++)
        if (p[i]) {
            if (!live_check(p[i], p[i], sz[i], sz[i], sd[i])) atomic_store(&live_failed, true);
            lull_free(p[i]);
        }
    return NULL;
}

static void *reclaimer(void *arg) {
    (void)arg;
    while (!atomic_load(&live_stop)) {
        if (!lull_reclaim_now()) {
            atomic_store(&live_failed, true);
            snprintf(live_msg, sizeof live_msg, "lull_reclaim_now() returned false");
            break;
        }
        atomic_fetch_add(&reclaim_calls, 1);
        sched_yield();
    }
    return NULL;
}

Test(reclaim, no_live_block_is_zeroed_by_a_purge, .timeout = 180) {
    lull_set_purge_delay_ms(0);
    lull_reclaim_stats s0, s1;
    lull_reclaim_get_stats(&s0);
    live_start = s0;
    pthread_t w1, w2, r;
    cr_assert_eq(pthread_create(&r, NULL, reclaimer, NULL), 0);
    cr_assert_eq(pthread_create(&w1, NULL, live_worker, (void *)1), 0);
    cr_assert_eq(pthread_create(&w2, NULL, live_worker, (void *)2), 0);
    pthread_join(w1, NULL);
    pthread_join(w2, NULL);
    atomic_store(&live_stop, true);
    pthread_join(r, NULL);
    lull_reclaim_get_stats(&s1);
    cr_assert_not(atomic_load(&live_failed), "%s", live_msg);
    cr_log_info("%lu reclaim_now calls, %lu MiB purged in %lu runs, %lu huge freed, %lu MiB of "
                "cached huge mappings purged",
                atomic_load(&reclaim_calls),
                (unsigned long)((s1.purged_bytes - s0.purged_bytes) >> 20),
                (unsigned long)(s1.purge_runs - s0.purge_runs),
                (unsigned long)(s1.huge_freed - s0.huge_freed),
                (unsigned long)((s1.huge_purged_bytes - s0.huge_purged_bytes) >> 20));
    /* the purges really ran while the blocks moved (freed huge mappings are
     * purged in the reclaim thread's cache, or unmapped) */
    cr_assert_gt(atomic_load(&reclaim_calls), MIN_CALLS);
    cr_assert_gt(s1.purge_runs - s0.purge_runs, MIN_RUNS);
    cr_assert_gt((s1.huge_freed - s0.huge_freed) + (s1.huge_purged_bytes - s0.huge_purged_bytes),
                 0u);
}

/* ---- the purge delay API ------------------------------------------------ */

Test(reclaim, purge_delay_round_trips) {
    static const long values[] = {0, 1, 250, 1234, 600000, -1, -2};
    for (size_t k = 0; k < sizeof values / sizeof values[0]; k++) {
        lull_set_purge_delay_ms(values[k]);
        cr_assert_eq(lull_purge_delay_ms(), values[k]);
    }
    /* below -2: never */
    lull_set_purge_delay_ms(-100);
    cr_assert_eq(lull_purge_delay_ms(), -1);
    /* above a day: a day (2^32 ms or more wrapped to "purge at once") */
    lull_set_purge_delay_ms(1L << 32);
    cr_assert_eq(lull_purge_delay_ms(), 86400000L);
    /* the reclaim thread sees the delay in force */
    lull_set_purge_delay_ms(4321);
    cr_assert(lull_reclaim_now());
    lull_reclaim_stats s;
    lull_reclaim_get_stats(&s);
    cr_assert(s.running);
    cr_assert_eq(s.delay_ms, 4321);
    /* and the configuration key sets the same value */
    cr_assert(lull_configure("purge_delay_ms", "never"));
    cr_assert_eq(lull_purge_delay_ms(), -1);
    cr_assert(lull_configure("purge_delay_ms", "auto"));
    cr_assert_eq(lull_purge_delay_ms(), -2);
    cr_assert(lull_configure("purge_delay_ms", "77"));
    cr_assert_eq(lull_purge_delay_ms(), 77);
}
