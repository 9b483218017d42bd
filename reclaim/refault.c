/* Refault monitor driving; see refault.h. Reclaim thread only. */
#define _GNU_SOURCE /* strerrorname_np */
#include "reclaim/refault.h"
#include "numa/arena.h"
#include "numa/slice_history.h"
#include "numa/slice_state.h"
#include "reclaim/policy.h"
#include "reclaim/uffd.h"
#include "base/bitmap.h"
#include "base/config.h"
#include "base/fork_exec.h"
#include "base/message.h"
#include "base/race.h"

#include <string.h>

#define SCAN_EVERY_MS 50
#define SCAN_REGIONS 64

/* The monitor's part of each segment (base/types.h, LULL_META_REFAULT): the
 * reclaim thread's alone. */
typedef struct segment_refault {
    _Atomic uint8_t registered; /* whole segment registered with userfaultfd */
} segment_refault;
LULL_META_PART_CHECK(segment_refault, REFAULT);

static segment_refault *refault_of(const lull_segment *s) {
    return lull_segment_part(s, LULL_META_REFAULT_AT);
}

/* written by a fork child (lull_refault_after_fork_child): on
 * base/fork_exec.h's page */
static refault_monitor M LULL_FORK_EXEC_DATA;
static bool opened LULL_FORK_EXEC_DATA;
static uint32_t last_scan_ms LULL_FORK_EXEC_DATA;
_Atomic uint64_t lull_refault_pages_seen;
static _Atomic uint64_t distance_sum_ms, distance[LULL_COUNTERS_REFAULT_BUCKETS];

void lull_refault_start(void) {
    refault_mechanism best = lull_config.refault_monitor == LULL_SWITCH_OFF  ? REFAULT_OFF
                             : lull_config.refault_monitor == LULL_SWITCH_ON ? REFAULT_WP_ASYNC
                                                                             : REFAULT_PRESENT_SCAN;
    refault_mechanism k = refault_monitor_open_at_most(&M, best);
    /* its descriptors are open, and a fork child, which closes them only
     * when `opened` says so, would keep them: the reclaim thread opens its
     * monitor under the step lock, which fork's prepare handler takes */
    LULL_RACE_POINT(LULL_RACE_RECLAIM_OPEN);
    opened = true;
    lull_verbose("refault monitor: %s%s%s", refault_mechanism_name(k), M.reason[0] ? " - " : "",
                 M.reason);
}

/* The monitor's kind, as another thread (the counter page) reads it: the
 * reclaim thread may give the mechanism up at run time. */
static refault_mechanism kind_now(void) {
    return __atomic_load_n(&M.kind, __ATOMIC_RELAXED);
}

/* A register, arm or scan that fails now failed after the open proved it
 * (a seccomp filter installed since, with TSYNC, denies the ioctl): left
 * on, the page counts would stop (scans) or count unarmed pages as written
 * (arms). The allocator's own accounting is kept all along: fall back to it
 * for good, and say so. */
static void lost(const char *what, long err) {
    refault_mechanism was = M.kind;
    refault_monitor_lost(&M, what);
    const char *name = err ? strerrorname_np((int)-err) : NULL;
    lull_message("refault monitor %s given up (%s: %s); counting reused purged slices",
                 refault_mechanism_name(was), what, name ? name : "error");
}

/* Write-protect the purged free slices of a segment just registered. Only a
 * fork child has any: its copies of the parent's segments come without the
 * parent's registration and markers (no UFFD_FEATURE_EVENT_FORK), and an
 * unprotected page reads as written, so each such slice taken again would
 * count all its pages as refaulted, written or not. A slice a request thread
 * takes meanwhile loses only the writes made before the arm from the count. */
static void arm_purged(lull_segment *s) {
    lull_slice_maps *maps = lull_slice_maps_of(s);
    lull_slice_history *history = lull_slice_history_of(s);
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        uint64_t clean = atomic_load_explicit(&maps->clean[w], memory_order_relaxed), purged = 0;
        for (uint64_t bits = clean; bits; bits &= bits - 1) {
            unsigned b = (unsigned)__builtin_ctzll(bits);
            if (atomic_load_explicit(&history->purged_ms[w * 64 + b], memory_order_relaxed))
                purged |= (uint64_t)1 << b;
        }
        while (purged) {
            unsigned b = (unsigned)__builtin_ctzll(purged);
            uint64_t rest = ~(purged >> b);
            unsigned len = rest ? (unsigned)__builtin_ctzll(rest) : 64 - b;
            int e =
                refault_arm(&M, lull_slice_address(s, w * 64 + b), (size_t)len << LULL_SLICE_SHIFT);
            if (e < 0) {
                lost("userfaultfd write-protect failed at run time", e);
                return;
            }
            purged &= ~lull_bits_mask(b, len);
        }
    }
}

/* Whole segments, once: registering part of one splits its VMA. Slices
 * watched already (a fork child's, taken again in the parent and not
 * scanned before the fork) were never armed here, and every page of them
 * reads as written: nothing to learn from them, so they are not scanned. */
static bool register_segment(lull_segment *s) {
    int e = refault_register(&M, s, LULL_SEGMENT_SIZE);
    if (e < 0) {
        lost("userfaultfd register failed at run time", e);
        return false;
    }
    atomic_store_explicit(&refault_of(s)->registered, 1, memory_order_relaxed);
    lull_slice_history *history = lull_slice_history_of(s);
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        uint64_t stale = atomic_load_explicit(&history->refault_watch[w], memory_order_relaxed);
        if (stale) /* only those: a bit set meanwhile is a reuse from now on */
            atomic_fetch_and_explicit(&history->refault_watch[w], ~stale, memory_order_relaxed);
    }
    arm_purged(s);
    return true;
}

static void register_segments(void) {
    for (int i = 0; i < lull_arena_count; i++)
        for (lull_segment *s = atomic_load_explicit(&lull_arenas[i].segments, memory_order_acquire);
             s; s = s->next)
            if (!atomic_load_explicit(&refault_of(s)->registered, memory_order_relaxed) &&
                !register_segment(s))
                return;
}

void lull_refault_after_purge(void *addr, size_t len) {
    if (!opened || M.kind != REFAULT_WP_ASYNC) return;
    lull_segment *s = (lull_segment *)((uintptr_t)addr & ~LULL_SEGMENT_MASK);
    /* a segment mapped since the last tick is purged before the tick
     * registers it: register it now, or its purged range stays unarmed and
     * every page of it reads as written when it is reused */
    if (!atomic_load_explicit(&refault_of(s)->registered, memory_order_relaxed))
        register_segment(s);
    /* MADV_DONTNEED dropped the markers: protect again before the slices
     * can be handed out, so their next writes are seen */
    if (M.kind == REFAULT_WP_ASYNC &&
        atomic_load_explicit(&refault_of(s)->registered, memory_order_relaxed)) {
        int e = refault_arm(&M, addr, len);
        if (e < 0) lost("userfaultfd write-protect failed at run time", e);
    }
}

static void record(uint64_t pages, uint32_t distance_ms) {
    atomic_fetch_add_explicit(&lull_refault_pages_seen, pages, memory_order_relaxed);
    atomic_fetch_add_explicit(&distance_sum_ms, pages * distance_ms, memory_order_relaxed);
    atomic_fetch_add_explicit(&distance[lull_counters_refault_bucket(distance_ms)], pages,
                              memory_order_relaxed);
}

/* Slices taken again after a purge: how many of their pages are back.
 * False when the scan failed and the monitor was given up. */
static bool scan_segment(lull_segment *s, uint32_t now) {
    struct page_region regions[SCAN_REGIONS];
    /* a segment mapped since this tick's registration: not registered yet,
     * and a scan of it would fail (EPERM) as if the monitor were lost */
    if (M.kind == REFAULT_WP_ASYNC &&
        !atomic_load_explicit(&refault_of(s)->registered, memory_order_relaxed))
        return true;
    lull_slice_history *history = lull_slice_history_of(s);
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        uint64_t watch = atomic_load_explicit(&history->refault_watch[w], memory_order_relaxed);
        if (!watch) continue;
        uint64_t got =
            atomic_fetch_and_explicit(&history->refault_watch[w], ~watch, memory_order_relaxed) &
            watch;
        uint64_t in_use = ~lull_slices_free_word(s, w);
        got &= in_use; /* freed again since: nothing to learn */
        while (got) {
            unsigned b = (unsigned)__builtin_ctzll(got);
            uint64_t rest = ~(got >> b);
            unsigned len = rest ? (unsigned)__builtin_ctzll(rest) : 64 - b;
            unsigned slice = w * 64 + b;
            uint32_t purged =
                atomic_load_explicit(&history->purged_ms[slice], memory_order_relaxed);
            /* a full region vector stops the walk early (scattered pages
             * are one region each): go on from where it stopped */
            uintptr_t at = (uintptr_t)lull_slice_address(s, slice);
            uintptr_t end = at + ((size_t)len << LULL_SLICE_SHIFT);
            size_t total = 0;
            while (at < end) {
                size_t pages = 0;
                long r =
                    refault_scan(&M, (void *)at, end - at, regions, SCAN_REGIONS, false, &pages);
                if (r < 0) {
                    /* before: the walk stopped here, and every later scan
                     * failed the same way, silently: refault_pages stood
                     * still under a mechanism still reported working */
                    lost("PAGEMAP_SCAN failed at run time", r);
                    return false;
                }
                total += pages;
                if (M.scan_end <= at || M.scan_end >= end) break;
                at = M.scan_end;
            }
            if (total) record(total, purged ? now - purged : 0);
            got &= ~lull_bits_mask(b, len);
        }
    }
    return true;
}

void lull_refault_tick(uint32_t now) {
    if (!opened) return;
    if (M.kind == REFAULT_WP_ASYNC) register_segments();
    if (M.kind != REFAULT_WP_ASYNC && M.kind != REFAULT_PRESENT_SCAN) return;
    if ((int32_t)(now - last_scan_ms) < SCAN_EVERY_MS) return;
    last_scan_ms = now;
    for (int i = 0; i < lull_arena_count; i++)
        for (lull_segment *s = atomic_load_explicit(&lull_arenas[i].segments, memory_order_acquire);
             s; s = s->next)
            if (!scan_segment(s, now)) return;
}

/* The parent's descriptors are closed (they point at the parent's memory)
 * and nothing is opened here: the child's reclaim thread opens its own
 * monitor when it starts (lull_refault_start), and a child that execs
 * first opens nothing. Before, the monitor was reopened here and again by
 * that thread, leaking the first pair of descriptors. */
LULL_FORK_EXEC_TEXT void lull_refault_after_fork_child(void) {
    if (!opened) return;
    refault_monitor_close(&M);
    opened = false;
    /* the child's memory is unregistered and unarmed: the child's monitor
     * registers it again lazily, arming the purged slices (arm_purged) */
    for (int i = 0; i < lull_arena_count; i++)
        for (lull_segment *s = atomic_load(&lull_arenas[i].segments); s; s = s->next)
            if (atomic_load(&refault_of(s)->registered)) /* no copy of a page for a 0 */
                atomic_store(&refault_of(s)->registered, 0);
    last_scan_ms = 0;
}

static bool counts_pages(refault_mechanism k) {
    return k == REFAULT_WP_ASYNC || k == REFAULT_PRESENT_SCAN;
}

uint64_t lull_refault_pages_back(void) {
    if (opened && counts_pages(kind_now()))
        return atomic_load_explicit(&lull_refault_pages_seen, memory_order_relaxed);
    return atomic_load_explicit(&lull_the_policy.refaulted_slices, memory_order_relaxed) *
           LULL_PAGES_PER_SLICE;
}

uint64_t lull_refault_fill_counters(struct lull_counters *out) {
    /* page-level figures where the kernel tells us; the allocator's own
     * slice-level count otherwise (16 pages a slice) */
    refault_mechanism k = opened ? kind_now() : REFAULT_ACCOUNTING;
    out->refault_pages = lull_refault_pages_back();
    if (counts_pages(k)) {
        out->refault_distance_ms_sum = atomic_load_explicit(&distance_sum_ms, memory_order_relaxed);
        for (int b = 0; b < LULL_COUNTERS_REFAULT_BUCKETS; b++)
            out->refault_distance[b] = atomic_load_explicit(&distance[b], memory_order_relaxed);
    } else {
        uint64_t per = LULL_PAGES_PER_SLICE;
        for (int b = 0; b < 16 && b < LULL_COUNTERS_REFAULT_BUCKETS; b++)
            out->refault_distance[b] = atomic_load_explicit(&lull_the_policy.refault_distance_ms[b],
                                                            memory_order_relaxed) *
                                       per;
    }
    switch (k) {
    case REFAULT_WP_ASYNC:
        return LULL_COUNTERS_REFAULT_UFFD_WP;
    case REFAULT_PRESENT_SCAN:
        return LULL_COUNTERS_REFAULT_PAGEMAP_SCAN;
    case REFAULT_ACCOUNTING:
        return LULL_COUNTERS_REFAULT_ACCOUNTING;
    default:
        return LULL_COUNTERS_REFAULT_OFF;
    }
}
