/* Transparent huge pages: see thp.h. */
#include "numa/thp.h"
#include "base/config.h"
#include "base/os.h"
#include "numa/parked_pages.h"
#include "numa/slice_state.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* thp=auto: free slices and parked pages kept in huge regions, at most an
 * eighth of what is huge or HELD_MIN, whichever is more; past it, the next
 * tick purges them (and splits). A fixed 64 MiB kept 20 MiB resident after
 * a 64 MiB heap was freed whole: the empty spans a heap keeps, one per
 * class, pinned ten regions (tests/test_thp.c). */
#define HELD_MIN ((uint64_t)8 << 20)
#define HALF ((uint64_t)0xffffffffu)

static _Atomic int state = -1; /* lull_thp_state, -1 before the first call */
static _Atomic bool keep_huge = true;
static _Atomic uint64_t retry_at_ms;
static _Atomic unsigned failures_in_a_row;
#define FAILURES_BEFORE_REST 16
static _Atomic uint64_t held_this_tick, held_last_tick;
static _Atomic uint64_t n_collapses, n_failures, n_splits, n_whole, n_huge_regions, n_prefaulted;
static _Atomic uint64_t held_regions_this_tick, held_regions_last_tick;

/* The system's setting: "always [madvise] never" and the like. */
static bool system_allows(void) {
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    char buf[96];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    return strstr(buf, "[never]") == NULL;
}

LULL_FORK_EXEC_TEXT lull_thp_state lull_thp_state_now(void) { /* a fork child asks */
    int s = atomic_load_explicit(&state, memory_order_relaxed);
    if (s >= 0) return (lull_thp_state)s;
    s = lull_config.thp == LULL_THP_NEVER ? LULL_THP_OFF
        : system_allows()                 ? LULL_THP_ON
                                          : LULL_THP_UNAVAILABLE;
    atomic_store_explicit(&state, s, memory_order_relaxed);
    return (lull_thp_state)s;
}

static uint16_t huge_bits(const lull_segment *s) {
    return atomic_load_explicit(&lull_thp_regions_of(s)->huge, memory_order_relaxed);
}

static void clear_huge(lull_segment *s, unsigned r) {
    atomic_fetch_and_explicit(&lull_thp_regions_of(s)->huge, (uint16_t) ~(1u << r),
                              memory_order_relaxed);
    atomic_fetch_sub_explicit(&n_huge_regions, 1, memory_order_relaxed);
}

uint64_t lull_thp_purgeable(lull_segment *s, unsigned w, uint64_t want, uint64_t free_bits) {
    uint16_t huge = huge_bits(s);
    if (!huge || !atomic_load_explicit(&keep_huge, memory_order_relaxed)) return want;
    for (unsigned h = 0; h < 2; h++) {
        unsigned r = w * 2 + h;
        uint64_t half = HALF << (32 * h);
        if (!(huge >> r & 1) || !(want & half) || (free_bits & half) == half) continue;
        /* a huge page with live slices: its free ones wait */
        atomic_fetch_add_explicit(&held_this_tick,
                                  (uint64_t)__builtin_popcountll(want & half) * LULL_SLICE_SIZE,
                                  memory_order_relaxed);
        atomic_fetch_add_explicit(&held_regions_this_tick, 1, memory_order_relaxed);
        want &= ~half;
    }
    return want;
}

void lull_thp_note_purge(lull_segment *s, unsigned w, uint64_t purged, uint64_t free_bits) {
    uint16_t huge = huge_bits(s);
    for (unsigned h = 0; h < 2 && huge; h++) {
        unsigned r = w * 2 + h;
        uint64_t half = HALF << (32 * h);
        if (!(huge >> r & 1) || !(purged & half)) continue;
        clear_huge(s, r);
        atomic_fetch_add_explicit((free_bits & half) == half ? &n_whole : &n_splits, 1,
                                  memory_order_relaxed);
    }
}

bool lull_thp_pages_purgeable(lull_segment *s, unsigned slice, unsigned pages) {
    unsigned r = slice / LULL_THP_REGION_SLICES;
    if (!(huge_bits(s) >> r & 1) || !atomic_load_explicit(&keep_huge, memory_order_relaxed))
        return true;
    /* every page that waits: the bound is judged by these bytes */
    atomic_fetch_add_explicit(&held_this_tick, (uint64_t)pages * LULL_PAGE_SIZE,
                              memory_order_relaxed);
    return false;
}

void lull_thp_note_page_purge(lull_segment *s, unsigned slice) {
    unsigned r = slice / LULL_THP_REGION_SLICES;
    if (!(huge_bits(s) >> r & 1)) return;
    clear_huge(s, r);
    atomic_fetch_add_explicit(&n_splits, 1, memory_order_relaxed);
}

/* Every slice of region r in use, and none of its pages parked or purged
 * (a collapse would fault those in again). */
static bool dense(const lull_segment *s, unsigned r) {
    unsigned w = r / 2, h = r % 2;
    if ((lull_slices_free_word(s, w) >> (32 * h)) & HALF) return false;
    for (unsigned i = r * LULL_THP_REGION_SLICES; i < (r + 1) * LULL_THP_REGION_SLICES; i++)
        if (atomic_load_explicit(&lull_parked_pages_of(s)->page_state[i], memory_order_relaxed))
            return false;
    return true;
}

bool lull_thp_tick_start(void) {
    if (!lull_thp_on()) return false;
    uint64_t held = atomic_exchange_explicit(&held_this_tick, 0, memory_order_relaxed);
    atomic_store_explicit(&held_last_tick, held, memory_order_relaxed);
    atomic_store_explicit(
        &held_regions_last_tick,
        atomic_exchange_explicit(&held_regions_this_tick, 0, memory_order_relaxed),
        memory_order_relaxed);
    uint64_t huge = atomic_load_explicit(&n_huge_regions, memory_order_relaxed) *
                    LULL_THP_REGION_SLICES * LULL_SLICE_SIZE;
    uint64_t bound = huge / 8 > HELD_MIN ? huge / 8 : HELD_MIN;
    atomic_store_explicit(&keep_huge, lull_config.thp == LULL_THP_ALWAYS || held <= bound,
                          memory_order_relaxed);
    return true;
}

static uint64_t mono_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC_COARSE, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* MADV_COLLAPSE of region r; false if it failed (counted). EAGAIN (the
 * region's pages written meanwhile, say) is tried again at a later tick;
 * after FAILURES_BEFORE_REST in a row (no huge page to be had), a second's
 * rest; EINVAL or ENOSYS: the kernel has no MADV_COLLAPSE (before 6.1). */
static bool collapse(lull_segment *s, unsigned r) {
    int err = lull_os_collapse((char *)s + (size_t)r * LULL_THP_REGION_SLICES * LULL_SLICE_SIZE,
                               (size_t)LULL_THP_REGION_SLICES * LULL_SLICE_SIZE);
    if (err == EINVAL || err == ENOSYS) {
        atomic_store_explicit(&state, LULL_THP_UNAVAILABLE, memory_order_relaxed);
        return false;
    }
    if (err) {
        atomic_fetch_add_explicit(&n_failures, 1, memory_order_relaxed);
        if (atomic_fetch_add_explicit(&failures_in_a_row, 1, memory_order_relaxed) + 1 >=
            FAILURES_BEFORE_REST) {
            atomic_store_explicit(&failures_in_a_row, 0, memory_order_relaxed);
            atomic_store_explicit(&retry_at_ms, mono_ms() + 1000, memory_order_relaxed);
        }
        return false;
    }
    atomic_store_explicit(&failures_in_a_row, 0, memory_order_relaxed);
    atomic_fetch_or_explicit(&lull_thp_regions_of(s)->huge, (uint16_t)(1u << r),
                             memory_order_relaxed);
    atomic_fetch_add_explicit(&n_huge_regions, 1, memory_order_relaxed);
    return true;
}

static bool resting(void) {
    return mono_ms() < atomic_load_explicit(&retry_at_ms, memory_order_relaxed);
}

uint64_t lull_thp_thread_cpu_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

unsigned lull_thp_collapse_dense(lull_segment *s, unsigned max, uint64_t until_cpu_ns) {
    /* thp=always: faults and khugepaged make huge pages too (a request
     * thread's first touch of a region may then fault 2 MiB: the user's
     * choice). Advised here, by the reclaim thread: request threads never
     * madvise. */
    if (lull_config.thp == LULL_THP_ALWAYS && !lull_thp_regions_of(s)->advised) {
        lull_os_advise_huge(s, LULL_SEGMENT_SIZE);
        lull_thp_regions_of(s)->advised = 1;
    }
    /* resting after failures: retrying at every busy tick would keep this
     * thread spinning */
    if (resting()) return 0;
    unsigned done = 0;
    for (unsigned r = 0; r < LULL_THP_REGIONS && done < max && lull_thp_on() && !resting(); r++) {
        if (huge_bits(s) >> r & 1 || !dense(s, r)) continue;
        done++;
        if (collapse(s, r)) atomic_fetch_add_explicit(&n_collapses, 1, memory_order_relaxed);
        if (until_cpu_ns && lull_thp_thread_cpu_ns() >= until_cpu_ns) break;
    }
    return done;
}

bool lull_thp_prefault_region(lull_segment *s, unsigned r) {
    if (!lull_thp_on() || resting()) return false;
    /* MADV_COLLAPSE refuses a region with no page at all (EINVAL, which
     * would read as a kernel without it): one page is faulted in first.
     * The collapse then zeroes the rest in the huge page itself, 150 us a
     * region here, where populating the 512 small pages and collapsing
     * them took 1.3-6.5 ms (docs/bench/thp.md) */
    volatile char *first = (char *)s + (size_t)r * LULL_THP_REGION_SLICES * LULL_SLICE_SIZE;
    *first = 0;
    if (!collapse(s, r)) return false;
    atomic_fetch_add_explicit(&n_prefaulted, 1, memory_order_relaxed);
    return true;
}

bool lull_thp_region_kept(lull_segment *s, unsigned slice) {
    unsigned r = slice / LULL_THP_REGION_SLICES, w = r / 2, h = r % 2;
    if (!(huge_bits(s) >> r & 1) || !atomic_load_explicit(&keep_huge, memory_order_relaxed))
        return false;
    uint64_t half = HALF << (32 * h);
    return (lull_slices_free_word(s, w) & half) != half;
}

void lull_thp_read(lull_thp_counters *out) {
    out->huge_bytes = atomic_load(&n_huge_regions) * LULL_THP_REGION_SLICES * LULL_SLICE_SIZE;
    out->collapses = atomic_load(&n_collapses);
    out->collapse_failures = atomic_load(&n_failures);
    out->splits = atomic_load(&n_splits);
    out->whole_purges = atomic_load(&n_whole);
    out->held_bytes = atomic_load(&held_last_tick);
    out->held_regions = atomic_load(&held_regions_last_tick);
    out->prefaulted_regions = atomic_load(&n_prefaulted);
}
