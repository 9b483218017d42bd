/* The adaptive purge policy (purge_delay_ms=auto, purge_mode=auto).
 *
 * Input: how long freed memory stays free before it is used again. Every
 * time a request thread takes slices from its arena it records, per slice,
 * the time since that slice was freed (a reuse interval), and whether the
 * slice had been purged in between (a refault at slice level: a wasted
 * purge). The refault monitor adds page-level evidence (which purged pages
 * were written again, and how soon).
 *
 * Delay: twice the 90th percentile of the recent reuse intervals, weighted
 * by slices (so the working set that comes back after a gap counts by its
 * size, not by how many small spans churn inside a burst), bounded to
 * [LULL_POLICY_MIN_MS, LULL_POLICY_MAX_MS] so that memory still returns
 * after a long idle, moved only when the target differs by more than 10 %
 * (hysteresis), and only once LULL_POLICY_MIN_SAMPLES slices were seen.
 * Samples age: the histogram decays by 1/8 every LULL_POLICY_PERIOD_MS, so
 * the delay follows a cadence that changes.
 *
 * Mode: MADV_FREE while purges are being wasted (refault ratio above 1/4)
 * and memory is not short; MADV_DONTNEED otherwise. Slices purged with
 * MADV_FREE that stay free for LULL_POLICY_LAZY_MAX_MS are purged again with
 * MADV_DONTNEED, so RSS falls after a long idle either way. */
#ifndef LULL_POLICY_H
#define LULL_POLICY_H

#include "base/hidden.h"
#include <stdbool.h>
#include <stdint.h>

#define LULL_POLICY_MIN_MS 10
#define LULL_POLICY_MAX_MS 2000
#define LULL_POLICY_DEFAULT_MS 200
#define LULL_POLICY_MIN_SAMPLES 20
#define LULL_POLICY_PERIOD_MS 250
#define LULL_POLICY_LAZY_MAX_MS 3000
#define LULL_POLICY_BUCKETS 72 /* 4 per power of two of ms, up to 2^18 ms */

typedef struct lull_policy {
    _Atomic uint64_t reuse[LULL_POLICY_BUCKETS]; /* slice-weighted reuse intervals */
    _Atomic uint64_t reused_slices;              /* count: slices taken again after a free */
    _Atomic uint64_t refaulted_slices;           /* count: ... of which had been purged */
    _Atomic uint64_t purged_slices;              /* count: slices purged */
    _Atomic uint64_t refault_distance_ms[16];    /* purge -> reuse, log2 ms buckets */
    long delay_ms;                               /* current automatic delay (reclaim thread) */
    uint32_t last_update_ms;
    uint64_t window_refaulted, window_purged; /* for the mode decision */
    int mode;                                 /* MADV_DONTNEED or MADV_FREE */
    bool memory_short;
} lull_policy;

extern LULL_HIDDEN lull_policy lull_the_policy;

/* Request threads (arena slow path): n slices taken, freed `interval_ms`
 * ago; purged: they had been purged `since_purge_ms` before. */
void lull_policy_record_reuse(lull_policy *p, uint32_t interval_ms, uint32_t n, bool purged,
                              uint32_t since_purge_ms);
void lull_policy_record_purge(lull_policy *p, uint32_t slices);
/* Reclaim thread: recompute (at most once a period) and return the delay. */
long lull_policy_delay(lull_policy *p, uint32_t now_ms);
int lull_policy_mode(lull_policy *p);
void lull_policy_set_memory_short(lull_policy *p, bool is_short);
void lull_policy_reset(lull_policy *p);
/* Bucket index of an interval, and the upper bound of a bucket (ms). */
unsigned lull_policy_bucket(uint32_t ms);
uint32_t lull_policy_bucket_max_ms(unsigned b);

#endif
