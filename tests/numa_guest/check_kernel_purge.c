/* Kernel checks: what the running kernel offers, and lull's purge backends
 * on it (group "kernel": run.sh --group kernel).
 *
 *   kernel_features            the kernel asked directly for each feature lull
 *                              probes (io_uring IORING_OP_MADVISE, process_madvise
 *                              with MADV_DONTNEED on self, PAGEMAP_SCAN,
 *                              userfaultfd and its features, seccomp RET_TRAP),
 *                              and lull's own start-up report (verbose=on)
 *   kernel_purge_auto          backend=auto, uring, process_madvise, madvise: a
 *   kernel_purge_uring         mix of about 38 MiB allocated, written, freed and
 *   kernel_purge_process_madvise  lull_purge_all(): the freed pages are no longer
 *   kernel_purge_madvise       resident (mincore), the backend lull_stats() names
 *                              is the one the kernel's answers call for (a forced
 *                              backend the kernel lacks falls back down the list,
 *                              with the fallback counted and the degraded flag
 *                              set), it did the purging, and no purge failed
 *   kernel_fault_uring_setup   LULL_FAULT=uring_setup: no ring, backend=auto falls
 *                              back (counted) and still purges
 *   kernel_fault_uring_cqe     io_uring madvise completions fail from some point
 *                              on (lull_fault_arm at run time): the ranges are
 *                              redone on the next backend, uring is given up
 *                              (counted), nothing is left resident or failed
 *
 * Each runs as a sub-check (guest.h) with its LULL_CONF and LULL_FAULT. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#define GUEST_GROUP "kernel"
#include "guest.h"
#include "guest_lull.h"

#include "base/fault.h"
#include "lull.h"
#include "lull/counters.h"

#include <stdio.h>
#include <string.h>

/* No counter page: the guest has no /dev/shm. lull says a fallback of a
 * backend asked for by name itself (the lines come back as INFO lines). */
#define BASE_CONF "counter_page=off"

/* ---- what the kernel offers ---- */

static int sub_features(void) {
    if (!guest_lull_ours()) return GUEST_FAIL;
    struct kernel_features k;
    kernel_features_probe(&k);
    char text[512];
    kernel_features_text(&k, text, sizeof text);
    guest_sub_info("%s", text);
    GUEST_SUB_REQUIRE(lull_reclaim_now(), "the reclaim thread is not running");
    struct lull_counters c;
    GUEST_SUB_REQUIRE(stats_now(&c), "lull_stats failed");
    guest_sub_detail("%s; lull: backend %s, refault monitor %s, purge mode %s", text,
                     lull_counters_backend_name(c.backend),
                     lull_counters_refault_name(c.refault_mechanism),
                     lull_counters_purge_mode_name(c.purge_mode));
    return GUEST_PASS;
}
GUEST_SUB("kernel_features", sub_features);

GUEST_CHECK_TIMEOUT(kernel_features, 60) {
    /* verbose: lull's own report of what it chose, and why */
    return guest_lull_sub("kernel_features", BASE_CONF ",verbose=on", NULL);
}

/* ---- purge and measure ---- */

struct purge_result {
    struct kernel_features k;
    struct lull_counters before, after;
    size_t resident, pages; /* of the freed blocks, after lull_purge_all() */
    long rss_full_kb, rss_after_kb;
    char purges[256];
};

/* Start the reclaim thread (its backend opens), then allocate the mix,
 * free it and purge everything. arm_after_start: a fault point to arm for
 * good once the backend is open (LULL_FAULT_COUNT for none). */
static int purge_measure(struct purge_result *r, lull_fault_point arm_after_start) {
    if (!guest_lull_ours()) return GUEST_FAIL;
    kernel_features_probe(&r->k);
    GUEST_SUB_REQUIRE(lull_reclaim_now(), "the reclaim thread is not running");
    GUEST_SUB_REQUIRE(stats_now(&r->before), "lull_stats failed");
    if (arm_after_start != LULL_FAULT_COUNT) lull_fault_arm(arm_after_start, -1);
    struct gset *s = gset_new();
    GUEST_SUB_REQUIRE(s, "mmap failed");
    GUEST_SUB_REQUIRE(gset_alloc_mix(s, 0x5a), "malloc failed");
    r->rss_full_kb = smaps_kb("Rss");
    gset_free(s);
    lull_purge_all();
    GUEST_SUB_REQUIRE(gset_resident(s, &r->resident, &r->pages), "mincore failed");
    if (r->resident) { /* which blocks: small, mid, large, huge */
        static const size_t lim[][2] = {
            {0, 7000}, {7001, 512 * KIB}, {512 * KIB + 1, 16 * MIB}, {16 * MIB + 1, SIZE_MAX}};
        size_t rk[4], pk[4];
        for (int i = 0; i < 4; i++)
            gset_resident_sized(s, lim[i][0], lim[i][1], &rk[i], &pk[i]);
        guest_sub_info("resident after lull_purge_all: small %zu of %zu pages, 24-150 KiB %zu of "
                       "%zu, large %zu of %zu, huge %zu of %zu",
                       rk[0], pk[0], rk[1], pk[1], rk[2], pk[2], rk[3], pk[3]);
    }
    if (arm_after_start != LULL_FAULT_COUNT) lull_fault_arm(arm_after_start, 0);
    GUEST_SUB_REQUIRE(stats_now(&r->after), "lull_stats failed");
    r->rss_after_kb = smaps_kb("Rss");
    gset_delete(s);
    stats_purges_text(&r->before, &r->after, r->purges, sizeof r->purges);
    return GUEST_PASS;
}

/* What every purge must show: the freed memory is gone, by the backend
 * lull names, without a failure. */
static int purge_verdict(const struct purge_result *r, const char *what) {
    const struct lull_counters *a = &r->after;
    uint64_t b = a->backend;
    GUEST_SUB_REQUIRE(b >= LULL_COUNTERS_BACKEND_URING && b < LULL_COUNTERS_BACKEND_COUNT,
                      "%s: backend %s while the reclaim thread runs", what,
                      lull_counters_backend_name(b));
    GUEST_SUB_REQUIRE(a->purge_calls[b] > r->before.purge_calls[b],
                      "%s: the backend in use (%s) purged nothing (%s)", what,
                      lull_counters_backend_name(b), r->purges);
    GUEST_SUB_REQUIRE(a->purge_errors == r->before.purge_errors, "%s: %llu purge errors (%s)", what,
                      (unsigned long long)(a->purge_errors - r->before.purge_errors), r->purges);
    GUEST_SUB_REQUIRE(r->pages > 0 && r->resident * 50 <= r->pages,
                      "%s: %zu of the %zu freed pages still resident after lull_purge_all (%s; "
                      "dirty %llu KiB, purged %llu KiB)",
                      what, r->resident, r->pages, r->purges,
                      (unsigned long long)(a->total.dirty / KIB),
                      (unsigned long long)(a->total.purged / KIB));
    GUEST_SUB_REQUIRE(a->total.dirty + a->total.purging == 0,
                      "%s: %llu KiB dirty, %llu purging after lull_purge_all", what,
                      (unsigned long long)(a->total.dirty / KIB),
                      (unsigned long long)(a->total.purging / KIB));
    return GUEST_PASS;
}

/* The backend lull must settle on when asked for want: the first one at or
 * below it in the list (uring, process_madvise, madvise) that the kernel
 * answered. */
static uint64_t expected_for(uint64_t want, const struct kernel_features *k) {
    if (want == LULL_COUNTERS_BACKEND_NONE || want == LULL_COUNTERS_BACKEND_URING)
        return kernel_expected_backend(k);
    if (want == LULL_COUNTERS_BACKEND_PROCESS_MADVISE && k->pm_dontneed == 0)
        return LULL_COUNTERS_BACKEND_PROCESS_MADVISE;
    return LULL_COUNTERS_BACKEND_MADVISE;
}

/* backend=want (NONE: auto). */
static int purge_backend_sub(uint64_t want) {
    struct purge_result r;
    if (purge_measure(&r, LULL_FAULT_COUNT) != GUEST_PASS) return GUEST_FAIL;
    const char *want_name = want ? lull_counters_backend_name(want) : "auto";
    char what[64];
    snprintf(what, sizeof what, "backend=%s", want_name);
    if (purge_verdict(&r, what) != GUEST_PASS) return GUEST_FAIL;
    const struct lull_counters *a = &r.after;
    uint64_t expect = expected_for(want, &r.k);
    GUEST_SUB_REQUIRE(a->backend == expect,
                      "backend=%s: lull uses %s, the kernel's answers call for %s (io_uring "
                      "madvise %s, process_madvise %s)",
                      want_name, lull_counters_backend_name(a->backend),
                      lull_counters_backend_name(expect), kernel_answer(r.k.uring_madvise),
                      kernel_answer(r.k.pm_dontneed));
    bool fell = want != LULL_COUNTERS_BACKEND_NONE && a->backend != want;
    if (fell) {
        GUEST_SUB_REQUIRE(a->backend_fallbacks >= 1, "backend=%s fell back to %s uncounted",
                          want_name, lull_counters_backend_name(a->backend));
        GUEST_SUB_REQUIRE(a->flags & LULL_COUNTERS_F_DEGRADED,
                          "backend=%s fell back to %s without the degraded flag", want_name,
                          lull_counters_backend_name(a->backend));
    }
    guest_sub_detail("backend=%s -> %s%s (fallbacks %llu%s); %s; freed pages resident %zu of %zu; "
                     "Rss %ld -> %ld KiB",
                     want_name, lull_counters_backend_name(a->backend), fell ? " (fallback)" : "",
                     (unsigned long long)a->backend_fallbacks,
                     a->flags & LULL_COUNTERS_F_DEGRADED ? ", degraded" : "", r.purges, r.resident,
                     r.pages, r.rss_full_kb, r.rss_after_kb);
    return GUEST_PASS;
}

static int sub_purge_auto(void) {
    return purge_backend_sub(LULL_COUNTERS_BACKEND_NONE);
}
static int sub_purge_uring(void) {
    return purge_backend_sub(LULL_COUNTERS_BACKEND_URING);
}
static int sub_purge_pm(void) {
    return purge_backend_sub(LULL_COUNTERS_BACKEND_PROCESS_MADVISE);
}
static int sub_purge_madvise(void) {
    return purge_backend_sub(LULL_COUNTERS_BACKEND_MADVISE);
}
GUEST_SUB("kernel_purge_auto", sub_purge_auto);
GUEST_SUB("kernel_purge_uring", sub_purge_uring);
GUEST_SUB("kernel_purge_process_madvise", sub_purge_pm);
GUEST_SUB("kernel_purge_madvise", sub_purge_madvise);

GUEST_CHECK_TIMEOUT(kernel_purge_auto, 120) {
    return guest_lull_sub("kernel_purge_auto", BASE_CONF ",backend=auto", NULL);
}
GUEST_CHECK_TIMEOUT(kernel_purge_uring, 120) {
    return guest_lull_sub("kernel_purge_uring", BASE_CONF ",backend=uring", NULL);
}
GUEST_CHECK_TIMEOUT(kernel_purge_process_madvise, 120) {
    return guest_lull_sub("kernel_purge_process_madvise", BASE_CONF ",backend=process_madvise",
                          NULL);
}
GUEST_CHECK_TIMEOUT(kernel_purge_madvise, 120) {
    return guest_lull_sub("kernel_purge_madvise", BASE_CONF ",backend=madvise", NULL);
}

/* ---- fault injection ---- */

/* LULL_FAULT=uring_setup: as a kernel with io_uring disabled. */
static int sub_fault_uring_setup(void) {
    struct purge_result r;
    if (purge_measure(&r, LULL_FAULT_COUNT) != GUEST_PASS) return GUEST_FAIL;
    if (purge_verdict(&r, "LULL_FAULT=uring_setup") != GUEST_PASS) return GUEST_FAIL;
    const struct lull_counters *a = &r.after;
    uint64_t expect = r.k.pm_dontneed == 0 ? LULL_COUNTERS_BACKEND_PROCESS_MADVISE
                                           : LULL_COUNTERS_BACKEND_MADVISE;
    GUEST_SUB_REQUIRE(a->backend == expect, "no ring: lull uses %s, expected %s",
                      lull_counters_backend_name(a->backend), lull_counters_backend_name(expect));
    GUEST_SUB_REQUIRE(a->backend_fallbacks >= 1 && (a->flags & LULL_COUNTERS_F_DEGRADED),
                      "no ring: fallbacks %llu, flags %#llx",
                      (unsigned long long)a->backend_fallbacks, (unsigned long long)a->flags);
    guest_sub_detail("io_uring setup failing: backend auto -> %s (fallbacks %llu, degraded); %s; "
                     "freed pages resident %zu of %zu",
                     lull_counters_backend_name(a->backend),
                     (unsigned long long)a->backend_fallbacks, r.purges, r.resident, r.pages);
    return GUEST_PASS;
}
GUEST_SUB("kernel_fault_uring_setup", sub_fault_uring_setup);

GUEST_CHECK_TIMEOUT(kernel_fault_uring_setup, 120) {
    return guest_lull_sub("kernel_fault_uring_setup", BASE_CONF ",backend=auto", "uring_setup");
}

/* Every io_uring madvise completion fails once the backend is open. */
static int sub_fault_uring_cqe(void) {
    struct kernel_features k;
    kernel_features_probe(&k);
    if (k.uring_madvise != 0) {
        guest_sub_detail("no io_uring madvise on this kernel (%s): nothing to fail",
                         kernel_answer(k.uring_madvise));
        return GUEST_SKIP;
    }
    struct purge_result r;
    if (purge_measure(&r, LULL_FAULT_URING_CQE) != GUEST_PASS) return GUEST_FAIL;
    GUEST_SUB_REQUIRE(r.before.backend == LULL_COUNTERS_BACKEND_URING,
                      "backend %s before the fault (the kernel has io_uring madvise)",
                      lull_counters_backend_name(r.before.backend));
    if (purge_verdict(&r, "failing io_uring completions") != GUEST_PASS) return GUEST_FAIL;
    const struct lull_counters *a = &r.after;
    uint64_t expect = r.k.pm_dontneed == 0 ? LULL_COUNTERS_BACKEND_PROCESS_MADVISE
                                           : LULL_COUNTERS_BACKEND_MADVISE;
    GUEST_SUB_REQUIRE(a->backend == expect, "after failing completions lull uses %s, expected %s",
                      lull_counters_backend_name(a->backend), lull_counters_backend_name(expect));
    GUEST_SUB_REQUIRE(a->backend_fallbacks > r.before.backend_fallbacks,
                      "uring given up uncounted (fallbacks %llu -> %llu)",
                      (unsigned long long)r.before.backend_fallbacks,
                      (unsigned long long)a->backend_fallbacks);
    guest_sub_detail("io_uring completions failing at run time: uring -> %s (fallbacks %llu -> "
                     "%llu); %s; freed pages resident %zu of %zu, no purge error",
                     lull_counters_backend_name(a->backend),
                     (unsigned long long)r.before.backend_fallbacks,
                     (unsigned long long)a->backend_fallbacks, r.purges, r.resident, r.pages);
    return GUEST_PASS;
}
GUEST_SUB("kernel_fault_uring_cqe", sub_fault_uring_cqe);

GUEST_CHECK_TIMEOUT(kernel_fault_uring_cqe, 120) {
    return guest_lull_sub("kernel_fault_uring_cqe", BASE_CONF ",backend=auto", NULL);
}

#endif /* LULL_GUEST_NO_LIB */
