/* The adaptive purge policy; see policy.h. Request threads only add to
 * counters (relaxed atomics on the arena slow path); the reclaim thread
 * reads, decays and decides. */
#include "reclaim/policy.h"
#include "base/linux_compat.h"

#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>

lull_policy lull_the_policy = {.delay_ms = LULL_POLICY_DEFAULT_MS, .mode = MADV_DONTNEED};

unsigned lull_policy_bucket(uint32_t ms) {
    if (ms < 1) return 0;
    unsigned e = 31u - (unsigned)__builtin_clz(ms);                    /* 2^e <= ms */
    unsigned q = e >= 2 ? (ms >> (e - 2)) & 3u : (ms << (2 - e)) & 3u; /* quarter */
    unsigned b = 1 + e * 4 + q;
    return b < LULL_POLICY_BUCKETS ? b : LULL_POLICY_BUCKETS - 1;
}

uint32_t lull_policy_bucket_max_ms(unsigned b) {
    if (b == 0) return 1;
    unsigned e = (b - 1) / 4, q = (b - 1) % 4;
    uint64_t base = (uint64_t)1 << e;
    uint64_t hi = base + (base * (q + 1)) / 4; /* exclusive upper bound */
    return hi > UINT32_MAX ? UINT32_MAX : (uint32_t)hi;
}

void lull_policy_record_reuse(lull_policy *p, uint32_t interval_ms, uint32_t n, bool purged,
                              uint32_t since_purge_ms) {
    atomic_fetch_add_explicit(&p->reuse[lull_policy_bucket(interval_ms)], n, memory_order_relaxed);
    atomic_fetch_add_explicit(&p->reused_slices, n, memory_order_relaxed);
    if (purged) {
        atomic_fetch_add_explicit(&p->refaulted_slices, n, memory_order_relaxed);
        unsigned b = since_purge_ms ? 32u - (unsigned)__builtin_clz(since_purge_ms) : 0;
        if (b > 15) b = 15;
        atomic_fetch_add_explicit(&p->refault_distance_ms[b], n, memory_order_relaxed);
    }
}

void lull_policy_record_purge(lull_policy *p, uint32_t slices) {
    atomic_fetch_add_explicit(&p->purged_slices, slices, memory_order_relaxed);
}

void lull_policy_set_memory_short(lull_policy *p, bool is_short) {
    /* atomic: read on other threads (tests) */
    __atomic_store_n(&p->memory_short, is_short, __ATOMIC_RELAXED);
}

static void recompute(lull_policy *p) {
    uint64_t h[LULL_POLICY_BUCKETS], total = 0;
    for (unsigned b = 0; b < LULL_POLICY_BUCKETS; b++) {
        h[b] = atomic_load_explicit(&p->reuse[b], memory_order_relaxed);
        total += h[b];
        /* age the samples: a cadence that changes is followed */
        if (h[b])
            atomic_fetch_sub_explicit(&p->reuse[b], h[b] - h[b] * 7 / 8, memory_order_relaxed);
    }
    if (total >= LULL_POLICY_MIN_SAMPLES) {
        uint64_t want = total - total / 10, acc = 0; /* the 90th percentile */
        unsigned b = 0;
        for (; b < LULL_POLICY_BUCKETS; b++)
            if ((acc += h[b]) >= want) break;
        long target = 2L * (long)lull_policy_bucket_max_ms(b);
        if (target < LULL_POLICY_MIN_MS) target = LULL_POLICY_MIN_MS;
        if (target > LULL_POLICY_MAX_MS) target = LULL_POLICY_MAX_MS;
        long diff = target - p->delay_ms;
        if (diff < 0) diff = -diff;
        /* 10 % hysteresis; atomic: lull_stats() reads it on any thread */
        if (diff * 10 > p->delay_ms) __atomic_store_n(&p->delay_ms, target, __ATOMIC_RELAXED);
    }
    /* the mode: are purges being wasted right now? */
    uint64_t refaulted = atomic_load_explicit(&p->refaulted_slices, memory_order_relaxed);
    uint64_t purged = atomic_load_explicit(&p->purged_slices, memory_order_relaxed);
    uint64_t dr = refaulted - p->window_refaulted, dp = purged - p->window_purged;
    if (dp >= 16) { /* enough purges in this period to judge */
        bool wasted = dr * 4 > dp;
        p->mode = wasted && !p->memory_short ? MADV_FREE : MADV_DONTNEED;
        p->window_refaulted = refaulted;
        p->window_purged = purged;
    } else if (p->memory_short) {
        p->mode = MADV_DONTNEED;
    }
}

long lull_policy_delay(lull_policy *p, uint32_t now_ms) {
    if (p->last_update_ms == 0 || (int32_t)(now_ms - p->last_update_ms) >= LULL_POLICY_PERIOD_MS) {
        p->last_update_ms = now_ms ? now_ms : 1;
        recompute(p);
    }
    return p->delay_ms;
}

int lull_policy_mode(lull_policy *p) {
    return p->mode;
}

void lull_policy_reset(lull_policy *p) {
    memset(p, 0, sizeof *p);
    p->delay_ms = LULL_POLICY_DEFAULT_MS;
    p->mode = MADV_DONTNEED;
}
