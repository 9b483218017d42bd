/* Kernel checks: the refault monitor (group "kernel").
 *
 *   kernel_refault_on        refault_monitor=on: the mechanism lull reports is
 *                            the one the kernel's answers call for (userfaultfd
 *                            WP_ASYNC + PAGEMAP_SCAN: uffd_wp; PAGEMAP_SCAN
 *                            alone: pagemap_scan; neither: accounting), and
 *                            purged memory written again is counted in
 *                            refault_pages
 *   kernel_refault_auto      refault_monitor=auto: never userfaultfd;
 *                            pagemap_scan where the kernel has it, else
 *                            accounting; refaults counted the same way
 *   kernel_refault_off       refault_monitor=off: the mechanism says off
 *   kernel_fault_uffd        refault_monitor=on with LULL_FAULT=uffd (no
 *                            userfaultfd): the next mechanism, still counting
 *   kernel_fault_pagemap_scan  refault_monitor=on with LULL_FAULT=pagemap_scan
 *                            (as a kernel before 6.7): accounting, still counting
 *
 * The workload, on CPU 0: 256 blocks of 64 KiB (16 MiB) written, freed and
 * purged with lull_purge_all(), then 256 blocks of 64 KiB allocated again
 * (they take the purged slices) and written; the reclaim thread's ticks
 * then count what came back. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#define GUEST_GROUP "kernel"
#include "guest.h"
#include "guest_lull.h"

#include "base/linux_compat.h"
#include "lull.h"
#include "lull/counters.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* No warm reserve: its prefaulting takes purged slices before the program
 * does (lull counts that itself), which makes the count depend on timing. */
#define BASE_CONF "counter_page=off,warm_reserve_mb=0"
#define BLOCKS 256
#define BLOCK (64 * KIB)

/* want: the mechanism the configuration and the kernel call for. */
static int refault_sub(const char *mode, uint64_t want, const char *why) {
    /* one CPU, so one node: a thread that moved to the other node between
     * the rounds would take that node's fresh slices, not the purged ones */
    GUEST_SUB_REQUIRE(guest_pin_cpu(0), "cannot pin to cpu 0");
    if (!guest_lull_ours()) return GUEST_FAIL;
    GUEST_SUB_REQUIRE(lull_reclaim_now(), "the reclaim thread is not running");
    struct lull_counters c0, c1, c2;
    GUEST_SUB_REQUIRE(stats_now(&c0), "lull_stats failed");
    uint64_t m = c0.refault_mechanism;
    GUEST_SUB_REQUIRE(m == want, "refault_monitor=%s: lull reports %s, %s calls for %s", mode,
                      lull_counters_refault_name(m), why, lull_counters_refault_name(want));
    struct gset *s = gset_new();
    GUEST_SUB_REQUIRE(s, "mmap failed");
    GUEST_SUB_REQUIRE(gset_alloc_same(s, BLOCKS, BLOCK, 0x11), "malloc failed");
    gset_free(s);
    gset_forget(s);
    lull_purge_all();
    GUEST_SUB_REQUIRE(stats_now(&c1), "lull_stats failed");
    uint64_t purged = c1.purged_pages - c0.purged_pages;
    GUEST_SUB_REQUIRE(purged * GUEST_PAGE >= (uint64_t)BLOCKS * BLOCK,
                      "only %llu pages purged of %zu KiB freed", (unsigned long long)purged,
                      (size_t)BLOCKS * BLOCK / KIB);
    GUEST_SUB_REQUIRE(gset_alloc_same(s, BLOCKS, BLOCK, 0x22), "malloc failed");
    uint64_t touched = (uint64_t)BLOCKS * BLOCK / GUEST_PAGE;
    /* the scans run every 50 ms of the reclaim thread's ticks */
    uint64_t got = 0;
    int ticks = 0;
    int max_ticks = m == LULL_COUNTERS_REFAULT_OFF ? 1 : 40;
    for (; ticks < max_ticks; ticks++) {
        lull_reclaim_now();
        GUEST_SUB_REQUIRE(stats_now(&c2), "lull_stats failed");
        got = c2.refault_pages - c1.refault_pages;
        if (got >= touched / 2 || ticks + 1 == max_ticks) break;
        usleep(60 * 1000);
    }
    gset_free(s);
    gset_delete(s);
    if (m == LULL_COUNTERS_REFAULT_OFF) {
        guest_sub_detail("refault_monitor=%s -> off (says so); %llu pages purged, 4096 written "
                         "again, refault_pages +%llu (not meaningful when off)",
                         mode, (unsigned long long)purged, (unsigned long long)got);
        return GUEST_PASS;
    }
    if (got < touched / 2)
        guest_sub_info(
            "after the second allocation: mapped %llu -> %llu KiB, purged %llu -> "
            "%llu KiB, dirty %llu, warm %llu -> %llu KiB, purged_pages +%llu, "
            "reclaim ticks %llu -> %llu",
            (unsigned long long)(c1.total.mapped / KIB),
            (unsigned long long)(c2.total.mapped / KIB),
            (unsigned long long)(c1.total.purged / KIB),
            (unsigned long long)(c2.total.purged / KIB), (unsigned long long)(c2.total.dirty / KIB),
            (unsigned long long)(c1.total.warm / KIB), (unsigned long long)(c2.total.warm / KIB),
            (unsigned long long)(c2.purged_pages - c1.purged_pages),
            (unsigned long long)c1.reclaim_ticks, (unsigned long long)c2.reclaim_ticks);
    GUEST_SUB_REQUIRE(got >= touched / 2,
                      "refault_monitor=%s (%s): %llu of %llu purged pages written again counted "
                      "after %d ticks",
                      mode, lull_counters_refault_name(m), (unsigned long long)got,
                      (unsigned long long)touched, ticks);
    /* what else says the monitor is not the best one: reported, not
     * required (backend_fallbacks and the degraded flag are the purge
     * backend's) */
    guest_sub_detail("refault_monitor=%s -> %s (%s); %llu pages purged, %llu written again: "
                     "refault_pages +%llu after %d tick(s); backend_fallbacks %llu, degraded "
                     "flag %s",
                     mode, lull_counters_refault_name(m), why, (unsigned long long)purged,
                     (unsigned long long)touched, (unsigned long long)got, ticks + 1,
                     (unsigned long long)c2.backend_fallbacks,
                     c2.flags & LULL_COUNTERS_F_DEGRADED ? "set" : "clear");
    return GUEST_PASS;
}

/* "PAGEMAP_SCAN yes, WP_ASYNC no" */
static const char *kernel_says(const struct kernel_features *k, char *buf, size_t len) {
    snprintf(buf, len, "the kernel (PAGEMAP_SCAN %s, userfaultfd %s, WP_ASYNC %s)",
             kernel_answer(k->pagemap_scan), kernel_answer(k->uffd),
             k->uffd_feats & UFFD_FEATURE_WP_ASYNC ? "yes" : "no");
    return buf;
}

static int sub_on(void) {
    struct kernel_features k;
    kernel_features_probe(&k);
    char why[160];
    return refault_sub("on", kernel_expected_refault_on(&k), kernel_says(&k, why, sizeof why));
}

static int sub_auto(void) {
    struct kernel_features k;
    kernel_features_probe(&k);
    char why[160];
    uint64_t want =
        k.pagemap_scan == 0 ? LULL_COUNTERS_REFAULT_PAGEMAP_SCAN : LULL_COUNTERS_REFAULT_ACCOUNTING;
    return refault_sub("auto", want, kernel_says(&k, why, sizeof why));
}

static int sub_off(void) {
    return refault_sub("off", LULL_COUNTERS_REFAULT_OFF, "the configuration");
}

static int sub_fault_uffd(void) {
    struct kernel_features k;
    kernel_features_probe(&k);
    char why[200], kw[160];
    snprintf(why, sizeof why, "no userfaultfd (LULL_FAULT=uffd) and %s",
             kernel_says(&k, kw, sizeof kw));
    uint64_t want =
        k.pagemap_scan == 0 ? LULL_COUNTERS_REFAULT_PAGEMAP_SCAN : LULL_COUNTERS_REFAULT_ACCOUNTING;
    return refault_sub("on", want, why);
}

static int sub_fault_pagemap_scan(void) {
    return refault_sub("on", LULL_COUNTERS_REFAULT_ACCOUNTING,
                       "no PAGEMAP_SCAN (LULL_FAULT=pagemap_scan)");
}

GUEST_SUB("kernel_refault_on", sub_on);
GUEST_SUB("kernel_refault_auto", sub_auto);
GUEST_SUB("kernel_refault_off", sub_off);
GUEST_SUB("kernel_fault_uffd", sub_fault_uffd);
GUEST_SUB("kernel_fault_pagemap_scan", sub_fault_pagemap_scan);

GUEST_CHECK_TIMEOUT(kernel_refault_on, 120) {
    return guest_lull_sub("kernel_refault_on", BASE_CONF ",refault_monitor=on", NULL);
}
GUEST_CHECK_TIMEOUT(kernel_refault_auto, 120) {
    return guest_lull_sub("kernel_refault_auto", BASE_CONF ",refault_monitor=auto", NULL);
}
GUEST_CHECK_TIMEOUT(kernel_refault_off, 120) {
    return guest_lull_sub("kernel_refault_off", BASE_CONF ",refault_monitor=off", NULL);
}
GUEST_CHECK_TIMEOUT(kernel_fault_uffd, 120) {
    return guest_lull_sub("kernel_fault_uffd", BASE_CONF ",refault_monitor=on", "uffd");
}
GUEST_CHECK_TIMEOUT(kernel_fault_pagemap_scan, 120) {
    return guest_lull_sub("kernel_fault_pagemap_scan", BASE_CONF ",refault_monitor=on",
                          "pagemap_scan");
}

#endif /* LULL_GUEST_NO_LIB */
