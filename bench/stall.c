/*
 * stall.c: what a request thread pays when memory is given back.
 *
 *   (a) touch one large block (512 MiB), time its single free();
 *   (b) allocate the same amount as 64 KiB blocks, touch them, time every
 *       free() of the bulk release (slowest and total), then a later churn of
 *       small blocks (16-512 B) in batches with short sleeps between them, so
 *       that time-driven purges of the freed memory land inside it: slowest
 *       malloc and slowest free;
 *   (c) RSS right after each release and `settle` ms (1.2 s) later.
 *
 * Everything runs on the main thread, which is the request thread here.
 * With --count-syscalls the same scenario runs again under a per-thread
 * seccomp filter (SECCOMP_RET_USER_NOTIF, answered by a supervisor thread
 * that counts and lets the call continue), and only the number of system
 * calls the request thread made inside each window is printed; timings of
 * that pass would be meaningless, so it prints none.
 *
 * The allocator comes from LD_PRELOAD; nothing here knows which one it is.
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define SC "stall"

struct config {
    uint64_t size_mib;
    uint64_t block_kib;
    uint64_t churn_ops;
    uint64_t churn_slots;
    uint64_t churn_batch;
    uint64_t churn_sleep_us;
    uint64_t settle_ms;
    int shuffle;
    int count_syscalls;
};

/* ---- system call counting on the request thread -------------------------- */

enum { WIN_NONE = -1, WIN_FREE_LARGE, WIN_BULK_FREE, WIN_CHURN, WIN_COUNT };
static const char *const win_names[WIN_COUNT] = {"free_large", "bulk_free", "churn"};

#define NR_MAX 512
static uint32_t sc_counts[WIN_COUNT][NR_MAX];
static _Atomic int sc_window = WIN_NONE;
static _Atomic int sc_fd = -1;
static pid_t sc_tid;

static inline void window(int w) {
    atomic_store(&sc_window, w);
}

static void *supervisor(void *arg) {
    (void)arg;
    int fd;
    while ((fd = atomic_load(&sc_fd)) < 0)
        sleep_ms(1);
    struct seccomp_notif_sizes sizes;
    if (syscall(SYS_seccomp, SECCOMP_GET_NOTIF_SIZES, 0, &sizes) != 0) {
        sizes.seccomp_notif = sizeof(struct seccomp_notif);
        sizes.seccomp_notif_resp = sizeof(struct seccomp_notif_resp);
    }
    static _Alignas(64) char reqbuf[4096], respbuf[4096];
    struct seccomp_notif *req = (struct seccomp_notif *)reqbuf;
    struct seccomp_notif_resp *resp = (struct seccomp_notif_resp *)respbuf;
    /* Runs until the process exits: closing the listener would make every
     * later system call of the filtered thread fail with ENOSYS. */
    for (;;) {
        memset(reqbuf, 0, sizes.seccomp_notif);
        if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, req) != 0) continue;
        int w = atomic_load(&sc_window);
        if (w >= 0 && (pid_t)req->pid == sc_tid && req->data.nr < NR_MAX)
            sc_counts[w][req->data.nr]++;
        memset(respbuf, 0, sizes.seccomp_notif_resp);
        resp->id = req->id;
        resp->flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
        ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, resp);
    }
    return NULL;
}

/* Installs the counting filter on the calling thread only (no TSYNC). */
static int install_counter(void) {
    pthread_t th;
    if (pthread_create(&th, NULL, supervisor, NULL) != 0) return -1;
    pthread_detach(th);
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return -1;
    sc_tid = (pid_t)syscall(SYS_gettid);
    int fd =
        (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0) return -1;
    atomic_store(&sc_fd, fd);
    return 0;
}

static void report_syscalls(void) {
    static const int purge_nrs[] = {SYS_madvise,
                                    SYS_munmap,
                                    SYS_mremap,
                                    440 /* process_madvise */,
                                    425 /* io_uring_setup */,
                                    426 /* io_uring_enter */,
                                    427 /* io_uring_register */};
    static const int map_nrs[] = {SYS_mmap, SYS_brk, SYS_mprotect};
    for (int w = 0; w < WIN_COUNT; w++) {
        uint64_t total = 0, purge = 0, map = 0;
        char detail[1024] = "";
        size_t dl = 0;
        for (int nr = 0; nr < NR_MAX; nr++) {
            uint32_t c = sc_counts[w][nr];
            if (!c || nr == SYS_nanosleep || nr == SYS_clock_nanosleep) continue;
            total += c;
            for (size_t k = 0; k < sizeof purge_nrs / sizeof purge_nrs[0]; k++)
                if (nr == purge_nrs[k]) purge += c;
            for (size_t k = 0; k < sizeof map_nrs / sizeof map_nrs[0]; k++)
                if (nr == map_nrs[k]) map += c;
            if (dl + 32 < sizeof detail)
                dl += (size_t)snprintf(detail + dl, sizeof detail - dl, " nr%d:%u", nr, c);
        }
        char m[64];
        snprintf(m, sizeof m, "sys_%s_total", win_names[w]);
        result(SC, m, (double)total, "calls");
        snprintf(m, sizeof m, "sys_%s_purge", win_names[w]);
        result(SC, m, (double)purge, "calls");
        snprintf(m, sizeof m, "sys_%s_map", win_names[w]);
        result(SC, m, (double)map, "calls");
        printf("INFO %s syscalls_%s (excluding the benchmark's own nanosleep):%s\n", SC,
               win_names[w], dl ? detail : " none");
    }
}

/* ---- the scenario ------------------------------------------------------ */

static void *xmalloc(size_t n) {
    void *p = malloc(n);
    if (!p) {
        fprintf(stderr, "malloc(%zu) failed\n", n);
        exit(1);
    }
    return p;
}

static hist_t h_bulk, h_churn_malloc, h_churn_free;

/* The machine's own noise for a loop like the bulk free: the slowest of
 * `windows` timed windows that each spin for `spin_ns` (the median free)
 * and call nothing, with the same context-switch reads between them. On a
 * shared VM this alone reaches tens of microseconds (interrupts, the host
 * taking the vCPU); a slowest free near it says nothing about the
 * allocator. */
static uint64_t noise_floor_ns(size_t windows, uint64_t spin_ns) {
    uint64_t slowest = 0;
    for (size_t k = 0; k < windows; k++) {
        long sw0 = thread_switches();
        uint64_t a = now_ns(), b;
        do
            b = now_ns();
        while (b - a < spin_ns);
        if (thread_switches() == sw0 && b - a > slowest) slowest = b - a;
    }
    return slowest;
}

static void scenario(const struct config *c) {
    const int timing = !c->count_syscalls;
    const size_t large = (size_t)c->size_mib << 20;
    const size_t bs = (size_t)c->block_kib << 10;
    const size_t nblocks = large / bs;
    uint64_t rng = 0x5eed;

    /* Let the allocator initialise (and start any threads) first. */
    for (int i = 0; i < 256; i++) {
        char *p = xmalloc(16 + (size_t)i * 8);
        p[0] = 1;
        free(p);
    }
    if (c->count_syscalls && install_counter() != 0) {
        printf("ERROR %s cannot install the seccomp counter: %s\n", SC, strerror(errno));
        exit(1);
    }
    double rss_base = rss_mib();

    /* (a) one large block */
    char *big = xmalloc(large);
    touch_pages(big, large);
    double rss_large_live = rss_mib();
    window(WIN_FREE_LARGE);
    uint64_t t0 = now_ns();
    free(big);
    uint64_t t1 = now_ns();
    window(WIN_NONE);
    double rss_after_large = rss_mib();
    sleep_ms(c->settle_ms);
    double rss_settled_large = rss_mib();
    if (timing) {
        result(SC, "free_large_us", (double)(t1 - t0) / 1e3, "us");
        result(SC, "rss_base_mib", rss_base, "MiB");
        result(SC, "rss_large_live_mib", rss_large_live, "MiB");
        result(SC, "rss_after_free_large_mib", rss_after_large, "MiB");
        result(SC, "rss_settled_free_large_mib", rss_settled_large, "MiB");
    }

    /* (b) bulk release of many 64 KiB blocks */
    void **blocks = map_array(nblocks * sizeof *blocks);
    uint32_t *order = map_array(nblocks * sizeof *order);
    for (size_t i = 0; i < nblocks; i++) {
        blocks[i] = xmalloc(bs);
        touch_pages(blocks[i], bs);
        order[i] = (uint32_t)i;
    }
    if (c->shuffle) shuffle_u32(order, nblocks, &rng);
    double rss_bulk_live = rss_mib();
    uint64_t slowest = 0, slowest_unswitched = 0, bulk_sum = 0;
    size_t slowest_at = 0, switched = 0;
    window(WIN_BULK_FREE);
    for (size_t k = 0; k < nblocks; k++) {
        /* Context switches of this thread around each free (read outside
         * the timed part; not in the syscall-counting pass): a free that
         * was switched out measures the scheduler as much as the
         * allocator. */
        long sw0 = timing ? thread_switches() : 0;
        uint64_t a = now_ns();
        free(blocks[order[k]]);
        uint64_t d = now_ns() - a;
        int was_switched = timing && thread_switches() != sw0;
        hist_add(&h_bulk, d);
        bulk_sum += d;
        if (d > slowest) {
            slowest = d;
            slowest_at = k;
        }
        if (was_switched)
            switched++;
        else if (d > slowest_unswitched)
            slowest_unswitched = d;
    }
    uint64_t bulk1 = now_ns();
    window(WIN_NONE);
    double rss_after_bulk = rss_mib();
    uint64_t noise_floor = timing ? noise_floor_ns(nblocks, hist_quantile(&h_bulk, 0.5)) : 0;

    /* later churn of small blocks */
    void **slots = map_array(c->churn_slots * sizeof *slots);
    double live_bytes = 0;
    size_t *sizes = map_array(c->churn_slots * sizeof *sizes);
    for (size_t s = 0; s < c->churn_slots; s++) {
        sizes[s] = 16 + rng_next(&rng) % 497;
        slots[s] = xmalloc(sizes[s]);
        memset(slots[s], 1, sizes[s]);
        live_bytes += (double)sizes[s];
    }
    long flt0 = thread_minflt();
    uint64_t churn0 = now_ns();
    window(WIN_CHURN);
    for (uint64_t i = 0; i < c->churn_ops; i++) {
        size_t s = rng_next(&rng) % c->churn_slots;
        size_t sz = 16 + rng_next(&rng) % 497;
        uint64_t a = now_ns();
        free(slots[s]);
        uint64_t b = now_ns();
        char *p = malloc(sz);
        uint64_t e = now_ns();
        if (!p) {
            fprintf(stderr, "malloc failed in churn\n");
            exit(1);
        }
        p[0] = (char)i;
        p[sz - 1] = (char)i;
        live_bytes += (double)sz - (double)sizes[s];
        slots[s] = p;
        sizes[s] = sz;
        hist_add(&h_churn_free, b - a);
        hist_add(&h_churn_malloc, e - b);
        if (c->churn_sleep_us && (i + 1) % c->churn_batch == 0) sleep_ns(c->churn_sleep_us * 1000);
    }
    window(WIN_NONE);
    uint64_t churn1 = now_ns();
    long flt1 = thread_minflt();

    uint64_t settle_at = bulk1 + c->settle_ms * 1000000ull;
    uint64_t now = now_ns();
    if (now < settle_at) sleep_ns(settle_at - now);
    double rss_settled_bulk = rss_mib();
    double waited_ms = (double)(now_ns() - bulk1) / 1e6;

    if (timing) {
        result(SC, "bulk_free_max_us", (double)slowest / 1e3, "us");
        result(SC, "bulk_free_p99_us", (double)hist_quantile(&h_bulk, 0.99) / 1e3, "us");
        result(SC, "bulk_free_max_unswitched_us", (double)slowest_unswitched / 1e3, "us");
        result(SC, "bulk_free_switched", (double)switched, "frees");
        result(SC, "bulk_free_noise_floor_us", (double)noise_floor / 1e3, "us");
        result(SC, "bulk_free_total_ms", (double)bulk_sum / 1e6, "ms");
        printf("INFO %s bulk_free slowest free was #%zu of %zu; %zu frees were switched out "
               "(bulk_free_max_unswitched_us: the slowest of the others)\n",
               SC, slowest_at, nblocks, switched);
        result(SC, "churn_malloc_max_us", (double)h_churn_malloc.max / 1e3, "us");
        result(SC, "churn_free_max_us", (double)h_churn_free.max / 1e3, "us");
        result(SC, "churn_malloc_p99_us", (double)hist_quantile(&h_churn_malloc, 0.99) / 1e3, "us");
        result(SC, "churn_free_p99_us", (double)hist_quantile(&h_churn_free, 0.99) / 1e3, "us");
        result(SC, "churn_minflt", (double)(flt1 - flt0), "faults");
        result(SC, "churn_ms", (double)(churn1 - churn0) / 1e6, "ms");
        result(SC, "rss_bulk_live_mib", rss_bulk_live, "MiB");
        result(SC, "rss_after_bulk_free_mib", rss_after_bulk, "MiB");
        result(SC, "rss_settled_bulk_mib", rss_settled_bulk, "MiB");
        /* The goal: settled RSS <= live * 1.05 + 8 MiB, live being what the
         * process had before (rss_base) plus the churn's live blocks. */
        double live = rss_base + live_bytes / BENCH_MIB;
        result(SC, "rss_live_mib", live, "MiB");
        result(SC, "rss_settled_excess_mib", rss_settled_bulk - live, "MiB");
        printf("INFO %s settled RSS read %.0f ms after the bulk free ended\n", SC, waited_ms);
    } else {
        report_syscalls();
    }
    for (size_t s = 0; s < c->churn_slots; s++)
        free(slots[s]);
}

static void usage(void) {
    fprintf(stderr, "usage: stall [--quick] [--size-mib N] [--block-kib N] [--churn-ops N]\n"
                    "             [--churn-slots N] [--churn-batch N] [--churn-sleep-us N]\n"
                    "             [--settle-ms N] [--shuffle] [--count-syscalls]\n");
    exit(2);
}

int main(int argc, char **argv) {
    struct config c = {.size_mib = 512,
                       .block_kib = 64,
                       .churn_ops = 200000,
                       .churn_slots = 1024,
                       .churn_batch = 1000,
                       .churn_sleep_us = 1000,
                       .settle_ms = 1200};
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            c.size_mib = 128;
            c.churn_ops = 50000;
        } else if (arg_flag(argv, i, "--shuffle")) {
            c.shuffle = 1;
        } else if (arg_flag(argv, i, "--count-syscalls")) {
            c.count_syscalls = 1;
        } else if (!arg_u64(argc, argv, &i, "--size-mib", &c.size_mib) &&
                   !arg_u64(argc, argv, &i, "--block-kib", &c.block_kib) &&
                   !arg_u64(argc, argv, &i, "--churn-ops", &c.churn_ops) &&
                   !arg_u64(argc, argv, &i, "--churn-slots", &c.churn_slots) &&
                   !arg_u64(argc, argv, &i, "--churn-batch", &c.churn_batch) &&
                   !arg_u64(argc, argv, &i, "--churn-sleep-us", &c.churn_sleep_us) &&
                   !arg_u64(argc, argv, &i, "--settle-ms", &c.settle_ms)) {
            usage();
        }
    }
    if (!c.size_mib || !c.block_kib || c.block_kib * 1024 > c.size_mib << 20 || !c.churn_slots ||
        !c.churn_batch)
        usage();
    bench_check_preload(SC);
    printf("INFO %s config size_mib=%llu block_kib=%llu churn_ops=%llu churn_slots=%llu "
           "churn_batch=%llu churn_sleep_us=%llu settle_ms=%llu order=%s\n",
           SC, (unsigned long long)c.size_mib, (unsigned long long)c.block_kib,
           (unsigned long long)c.churn_ops, (unsigned long long)c.churn_slots,
           (unsigned long long)c.churn_batch, (unsigned long long)c.churn_sleep_us,
           (unsigned long long)c.settle_ms, c.shuffle ? "shuffled" : "allocation");
    fflush(stdout);
    scenario(&c);
    fflush(stdout);
    return 0;
}
