/* Helpers of the kernel checks; see guest_lull.h. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#include "guest_lull.h"

#include "base/linux_compat.h"
#include "lull.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <linux/seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef __NR_userfaultfd
#define __NR_userfaultfd 323
#endif

int guest_lull_sub(const char *name, const char *conf, const char *fault) {
    char c[512], f[256];
    const char *env[3] = {NULL, NULL, NULL};
    int n = 0;
    snprintf(c, sizeof c, "LULL_CONF=%s", conf ? conf : "");
    env[n++] = c;
    if (fault) {
        snprintf(f, sizeof f, "LULL_FAULT=%s", fault);
        env[n++] = f;
    }
    return guest_sub_run(name, env);
}

bool guest_lull_ours(void) {
    void *probe = calloc(1, 64);
    bool ours = lull_owns(probe);
    free(probe);
    if (!ours) guest_sub_detail("malloc is not lull's (liblull.a built without LULL_OVERRIDE?)");
    return ours;
}

/* ---- blocks ---- */

struct gset *gset_new(void) {
    return guest_map(sizeof(struct gset));
}

void gset_delete(struct gset *s) {
    if (s) munmap(s, sizeof *s);
}

static bool gset_add(struct gset *s, size_t size, unsigned char fill) {
    if (s->n >= GSET_MAX) return false;
    unsigned char *p = malloc(size);
    if (!p) return false;
    for (size_t off = 0; off < size; off += GUEST_PAGE)
        p[off] = fill;
    p[size - 1] = fill;
    s->p[s->n] = p;
    s->size[s->n++] = size;
    s->bytes += size;
    return true;
}

bool gset_alloc_mix(struct gset *s, unsigned char fill) {
    static const size_t small[] = {16, 40, 96, 200, 520, 1100, 3000, 7000};
    static const size_t mid[] = {24 * KIB, 48 * KIB, 72 * KIB, 150 * KIB};
    for (int i = 0; i < 2000; i++)
        if (!gset_add(s, small[i % 8], fill)) return false;
    for (int i = 0; i < 64; i++)
        if (!gset_add(s, mid[i % 4], fill)) return false;
    for (int i = 0; i < 8; i++)
        if (!gset_add(s, 1 * MIB, fill)) return false;
    return gset_add(s, 24 * MIB, fill);
}

bool gset_alloc_same(struct gset *s, int n, size_t size, unsigned char fill) {
    for (int i = 0; i < n; i++)
        if (!gset_add(s, size, fill)) return false;
    return true;
}

void gset_free(struct gset *s) {
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
}

void gset_forget(struct gset *s) {
    s->n = 0;
    s->bytes = 0;
}

/* In place, no malloc: glibc's qsort mallocs a buffer for large arrays,
 * which would take (and write) the very slices being measured. */
static void sift_down(uintptr_t *v, size_t at, size_t n) {
    for (;;) {
        size_t big = at, l = 2 * at + 1, r = l + 1;
        if (l < n && v[l] > v[big]) big = l;
        if (r < n && v[r] > v[big]) big = r;
        if (big == at) return;
        uintptr_t t = v[at];
        v[at] = v[big];
        v[big] = t;
        at = big;
    }
}

static void heap_sort(uintptr_t *v, size_t n) {
    for (size_t i = n / 2; i-- > 0;)
        sift_down(v, i, n);
    for (size_t end = n; end-- > 1;) {
        uintptr_t t = v[0];
        v[0] = v[end];
        v[end] = t;
        sift_down(v, 0, end);
    }
}

/* Resident pages of [a, a + n pages): one mincore call, or page by page
 * where part of the range is no longer mapped (ENOMEM). -1 on another
 * error. */
static long resident_run(uintptr_t a, size_t n, unsigned char *vec) {
    if (mincore((void *)a, n * GUEST_PAGE, vec) == 0) {
        long r = 0;
        for (size_t i = 0; i < n; i++)
            r += vec[i] & 1;
        return r;
    }
    if (errno != ENOMEM) return -1;
    long r = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char v;
        if (mincore((void *)(a + i * GUEST_PAGE), GUEST_PAGE, &v) == 0)
            r += v & 1;
        else if (errno != ENOMEM)
            return -1;
    }
    return r;
}

bool gset_resident(const struct gset *s, size_t *resident, size_t *pages) {
    return gset_resident_sized(s, 0, SIZE_MAX, resident, pages);
}

bool gset_resident_sized(const struct gset *s, size_t min, size_t max, size_t *resident,
                         size_t *pages) {
    *resident = *pages = 0;
    size_t cap = 0;
    for (int i = 0; i < s->n; i++)
        if (s->size[i] >= min && s->size[i] <= max) cap += s->size[i] / GUEST_PAGE + 2;
    if (cap == 0) return true;
    size_t bytes = (cap * sizeof(uintptr_t) + GUEST_PAGE - 1) & ~(GUEST_PAGE - 1);
    uintptr_t *pg = guest_map(bytes);
    if (!pg) return false;
    size_t n = 0;
    for (int i = 0; i < s->n; i++) {
        if (s->size[i] < min || s->size[i] > max) continue;
        uintptr_t a = (uintptr_t)s->p[i] & ~(GUEST_PAGE - 1);
        for (uintptr_t end = (uintptr_t)s->p[i] + s->size[i]; a < end; a += GUEST_PAGE)
            pg[n++] = a;
    }
    heap_sort(pg, n);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || pg[u - 1] != pg[i]) pg[u++] = pg[i];
    static unsigned char vec[8192];
    bool ok = true;
    for (size_t i = 0; i < u && ok;) {
        size_t run = 1;
        while (i + run < u && run < sizeof vec && pg[i + run] == pg[i] + run * GUEST_PAGE)
            run++;
        long r = resident_run(pg[i], run, vec);
        if (r < 0)
            ok = false;
        else
            *resident += (size_t)r;
        i += run;
    }
    *pages = u;
    munmap(pg, bytes);
    return ok;
}

/* ---- the process ---- */

long smaps_kb(const char *field) {
    /* read(2), not stdio: fopen would malloc from the heap being measured */
    static char buf[4096];
    int fd = open("/proc/self/smaps_rollup", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    size_t fl = strlen(field);
    for (const char *line = buf; *line;) {
        if (strncmp(line, field, fl) == 0 && line[fl] == ':')
            return strtol(line + fl + 1, NULL, 10);
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return -1;
}

/* ---- lull_stats ---- */

bool stats_now(struct lull_counters *c) {
    return lull_stats(c) == 0;
}

uint64_t stats_purged_bytes(const struct lull_counters *c) {
    uint64_t b = 0;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++)
        b += c->purge_bytes[k];
    return b;
}

void stats_purges_text(const struct lull_counters *a, const struct lull_counters *b, char *buf,
                       size_t len) {
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT; k++) {
        uint64_t calls = b->purge_calls[k] - (a ? a->purge_calls[k] : 0);
        uint64_t sys = b->purge_syscalls[k] - (a ? a->purge_syscalls[k] : 0);
        uint64_t bytes = b->purge_bytes[k] - (a ? a->purge_bytes[k] : 0);
        if (!calls && !sys) continue;
        if (at < len)
            at += (size_t)snprintf(buf + at, len - at, "%s%s %llu ranges/%llu syscalls/%llu KiB",
                                   at ? ", " : "", lull_counters_backend_name((uint64_t)k),
                                   (unsigned long long)calls, (unsigned long long)sys,
                                   (unsigned long long)(bytes / KIB));
    }
    if (!buf[0]) snprintf(buf, len, "no purges");
}

static bool acct_holds(const struct lull_counters_accounting *a, const char *where, char *why,
                       size_t len) {
    uint64_t sum = lull_counters_accounting_sum(a);
    if (sum == a->mapped) return true;
    snprintf(why, len,
             "%s: mapped %llu != sum %llu (live %llu rounding %llu span_free %llu dirty %llu "
             "purging %llu purged %llu warm %llu metadata %llu)",
             where, (unsigned long long)a->mapped, (unsigned long long)sum,
             (unsigned long long)a->live, (unsigned long long)a->rounding,
             (unsigned long long)a->span_free, (unsigned long long)a->dirty,
             (unsigned long long)a->purging, (unsigned long long)a->purged,
             (unsigned long long)a->warm, (unsigned long long)a->metadata);
    return false;
}

bool stats_identity(const struct lull_counters *c, char *why, size_t len) {
    why[0] = '\0';
    if (!acct_holds(&c->total, "total", why, len)) return false;
    struct lull_counters_accounting sum = {0};
    for (uint64_t n = 0; n < c->node_count && n < LULL_COUNTERS_MAX_NODES; n++) {
        const struct lull_counters_accounting *a = &c->nodes[n].acct;
        char where[32];
        snprintf(where, sizeof where, "node entry %llu", (unsigned long long)n);
        if (!acct_holds(a, where, why, len)) return false;
        sum.mapped += a->mapped;
        sum.live += a->live;
        sum.span_free += a->span_free;
        sum.purged += a->purged;
    }
    if (sum.mapped != c->total.mapped || sum.live != c->total.live ||
        sum.span_free != c->total.span_free || sum.purged != c->total.purged) {
        snprintf(why, len,
                 "the nodes do not sum to the totals: mapped %llu/%llu live %llu/%llu span_free "
                 "%llu/%llu purged %llu/%llu",
                 (unsigned long long)sum.mapped, (unsigned long long)c->total.mapped,
                 (unsigned long long)sum.live, (unsigned long long)c->total.live,
                 (unsigned long long)sum.span_free, (unsigned long long)c->total.span_free,
                 (unsigned long long)sum.purged, (unsigned long long)c->total.purged);
        return false;
    }
    return true;
}

/* ---- what the kernel offers ---- */

const char *kernel_answer(int r) {
    if (r == 0) return "yes";
    const char *s = strerrorname_np(-r);
    return s ? s : "error";
}

static void *scratch_page(void) {
    void *p = mmap(NULL, GUEST_PAGE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    *(volatile char *)p = 1;
    return p;
}

/* One IORING_OP_MADVISE(MADV_DONTNEED) on a touched page; the page must
 * then be gone (that is what lull's own probe asks of the op, too). */
static int probe_uring(void) {
    struct io_uring ring;
    int r = io_uring_queue_init(4, &ring, 0);
    if (r < 0) return r;
    char *p = scratch_page();
    if (!p) {
        io_uring_queue_exit(&ring);
        return -ENOMEM;
    }
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    io_uring_prep_madvise(sqe, p, (off_t)GUEST_PAGE, MADV_DONTNEED);
    r = io_uring_submit_and_wait(&ring, 1);
    if (r >= 0) {
        struct io_uring_cqe *cqe;
        r = io_uring_peek_cqe(&ring, &cqe);
        if (r == 0) {
            r = cqe->res;
            io_uring_cqe_seen(&ring, cqe);
        }
    }
    unsigned char v = 1;
    if (r == 0 && (mincore(p, GUEST_PAGE, &v) != 0 || (v & 1))) r = -EIO;
    io_uring_queue_exit(&ring);
    munmap(p, GUEST_PAGE);
    return r;
}

static int probe_pm(void) {
    int fd = (int)syscall(SYS_pidfd_open, getpid(), 0u);
    if (fd < 0) return -errno;
    char *p = scratch_page();
    if (!p) {
        close(fd);
        return -ENOMEM;
    }
    struct iovec v = {p, GUEST_PAGE};
    long r = syscall(__NR_process_madvise, fd, &v, 1, MADV_DONTNEED, 0u);
    int e = r < 0 ? -errno : r == (long)GUEST_PAGE ? 0 : -EIO;
    close(fd);
    munmap(p, GUEST_PAGE);
    return e;
}

static int probe_pagemap_scan(void) {
    int fd = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -errno;
    char *p = scratch_page();
    struct page_region v[1];
    struct pm_scan_arg a;
    memset(&a, 0, sizeof a);
    a.size = sizeof a;
    a.start = (uintptr_t)p;
    a.end = (uintptr_t)p + GUEST_PAGE;
    a.vec = (uintptr_t)v;
    a.vec_len = 1;
    a.category_anyof_mask = PAGE_IS_PRESENT;
    a.return_mask = PAGE_IS_PRESENT;
    int r = p ? (int)ioctl(fd, PAGEMAP_SCAN, &a) : -1;
    int e = r == 1 ? 0 : r < 0 ? -errno : -EIO;
    if (!p) e = -ENOMEM;
    close(fd);
    if (p) munmap(p, GUEST_PAGE);
    return e;
}

static int probe_uffd(uint64_t *features) {
    *features = 0;
    int fd = (int)syscall(__NR_userfaultfd, O_CLOEXEC | O_NONBLOCK | UFFD_USER_MODE_ONLY);
    if (fd < 0) return -errno;
    struct uffdio_api api = {.api = UFFD_API, .features = 0};
    int e = ioctl(fd, UFFDIO_API, &api) == 0 ? 0 : -errno;
    if (e == 0) *features = api.features;
    close(fd);
    return e;
}

static int probe_seccomp_trap(void) {
    unsigned action = SECCOMP_RET_TRAP;
    return syscall(SYS_seccomp, SECCOMP_GET_ACTION_AVAIL, 0, &action) == 0 ? 0 : -errno;
}

void kernel_features_probe(struct kernel_features *k) {
    memset(k, 0, sizeof *k);
    k->uring_madvise = probe_uring();
    k->pm_dontneed = probe_pm();
    k->pagemap_scan = probe_pagemap_scan();
    k->uffd = probe_uffd(&k->uffd_feats);
    k->seccomp_trap = probe_seccomp_trap();
}

static bool has_wp_async(const struct kernel_features *k) {
    const uint64_t need = UFFD_FEATURE_WP_ASYNC | UFFD_FEATURE_WP_UNPOPULATED;
    return k->uffd == 0 && (k->uffd_feats & need) == need;
}

uint64_t kernel_expected_backend(const struct kernel_features *k) {
    if (k->uring_madvise == 0) return LULL_COUNTERS_BACKEND_URING;
    if (k->pm_dontneed == 0) return LULL_COUNTERS_BACKEND_PROCESS_MADVISE;
    return LULL_COUNTERS_BACKEND_MADVISE;
}

uint64_t kernel_expected_refault_on(const struct kernel_features *k) {
    if (k->pagemap_scan != 0) return LULL_COUNTERS_REFAULT_ACCOUNTING;
    return has_wp_async(k) ? LULL_COUNTERS_REFAULT_UFFD_WP : LULL_COUNTERS_REFAULT_PAGEMAP_SCAN;
}

void kernel_features_text(const struct kernel_features *k, char *buf, size_t len) {
    snprintf(
        buf, len,
        "kernel offers: io_uring madvise %s, process_madvise(self, DONTNEED) %s, "
        "PAGEMAP_SCAN %s, userfaultfd %s (features %#llx: WP_ASYNC %s, WP_UNPOPULATED %s), "
        "seccomp RET_TRAP %s",
        kernel_answer(k->uring_madvise), kernel_answer(k->pm_dontneed),
        kernel_answer(k->pagemap_scan), kernel_answer(k->uffd), (unsigned long long)k->uffd_feats,
        k->uffd_feats & UFFD_FEATURE_WP_ASYNC ? "yes" : "no",
        k->uffd_feats & UFFD_FEATURE_WP_UNPOPULATED ? "yes" : "no", kernel_answer(k->seccomp_trap));
}

#endif /* LULL_GUEST_NO_LIB */
