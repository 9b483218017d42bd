/* Helpers of the kernel checks (check_kernel_*.c), which run the whole
 * allocator (build.sh --lib): sub-checks with LULL_CONF and LULL_FAULT,
 * sets of blocks, what is resident, lull_stats() figures in words, the
 * accounting identity, and the kernel's own answer to each feature lull
 * probes for (asked here directly, so that a check can compare lull's
 * choice with what the kernel offers). Only with --lib (guest_lull.c
 * compiles itself out under LULL_GUEST_NO_LIB). */
#ifndef LULL_GUEST_LULL_H
#define LULL_GUEST_LULL_H

#include "guest.h"
#include "lull/counters.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define GUEST_PAGE ((size_t)4096)

/* Sub-check name in a fresh process with LULL_CONF=conf and, when fault is
 * not NULL, LULL_FAULT=fault. */
int guest_lull_sub(const char *name, const char *conf, const char *fault);

/* malloc is lull's (else a guest_sub_detail() says so). */
bool guest_lull_ours(void);

/* ---- blocks ---- */

#define GSET_MAX 4096
struct gset {
    int n;
    size_t bytes;
    void *p[GSET_MAX];
    size_t size[GSET_MAX];
};

/* Not malloc: the measuring structures stay out of lull's heaps. */
struct gset *gset_new(void);
void gset_delete(struct gset *s);
/* The mix: 2000 small blocks of 16 B - 7 KiB, 64 of 24-150 KiB, 8 large
 * of 1 MiB and one huge block of 24 MiB (about 38 MiB), every page
 * written with fill. false when malloc fails. */
bool gset_alloc_mix(struct gset *s, unsigned char fill);
/* n blocks of size bytes, every page written. */
bool gset_alloc_same(struct gset *s, int n, size_t size, unsigned char fill);
void gset_free(struct gset *s); /* keeps the addresses (n stays) for gset_resident */
void gset_forget(struct gset *s);
/* Distinct pages the blocks of s cover, and how many of them are resident
 * (mincore; a page no longer mapped is not resident). false when the
 * kernel refused (errno). */
bool gset_resident(const struct gset *s, size_t *resident, size_t *pages);
/* The same over the blocks of min to max bytes. */
bool gset_resident_sized(const struct gset *s, size_t min, size_t max, size_t *resident,
                         size_t *pages);

/* ---- the process ---- */

/* A field of /proc/self/smaps_rollup in KiB ("Rss", "AnonHugePages"), or
 * -1 when absent. */
long smaps_kb(const char *field);

/* ---- lull_stats ---- */

bool stats_now(struct lull_counters *c); /* lull_stats(); false on failure */
/* Bytes purged by every backend together. */
uint64_t stats_purged_bytes(const struct lull_counters *c);
/* "uring: 12 ranges/3 syscalls, madvise: 2/2" for the backends that did
 * something between a and b (a nullable: since the start). */
void stats_purges_text(const struct lull_counters *a, const struct lull_counters *b, char *buf,
                       size_t len);
/* The identity over the whole process and each node, and the nodes' terms
 * summing to the totals; "" or what differs in why. */
bool stats_identity(const struct lull_counters *c, char *why, size_t len);

/* ---- what the kernel offers, asked directly ---- */

struct kernel_features {
    int uring_madvise;   /* 0: an IORING_OP_MADVISE request purged a page; else -errno */
    int pm_dontneed;     /* 0: process_madvise(self, MADV_DONTNEED) purged a page; else -errno */
    int pagemap_scan;    /* 0: the PAGEMAP_SCAN ioctl answered; else -errno */
    int uffd;            /* 0: userfaultfd(UFFD_USER_MODE_ONLY) + UFFDIO_API; else -errno */
    uint64_t uffd_feats; /* features UFFDIO_API offered */
    int seccomp_trap;    /* 0: seccomp filters can answer SECCOMP_RET_TRAP
                          * (SECCOMP_GET_ACTION_AVAIL; nothing is installed); else -errno */
};
void kernel_features_probe(struct kernel_features *k);
/* The purge backend lull's auto choice must come to on this kernel
 * (LULL_COUNTERS_BACKEND_*), and the refault mechanism of
 * refault_monitor=on (LULL_COUNTERS_REFAULT_*). */
uint64_t kernel_expected_backend(const struct kernel_features *k);
uint64_t kernel_expected_refault_on(const struct kernel_features *k);
/* "io_uring madvise yes, process_madvise(DONTNEED) no (EINVAL), ..." */
void kernel_features_text(const struct kernel_features *k, char *buf, size_t len);
/* "EINVAL" for -EINVAL, "yes" for 0. */
const char *kernel_answer(int r);

#endif
