/*
 * slow_free_trace.c: what happens on the CPU while one free() of a bulk free
 * is slow. Run by slow_free_trace.sh, which turns on kernel tracing of that
 * CPU (interrupts, IPIs, TLB flushes, page faults, context switches).
 *
 * The program pins itself to one CPU, allocates --mib MiB (512) of
 * --block-kib KiB (64) blocks, touches them, frees them in random order
 * and writes every free slower than --slow-us (50) to the kernel's
 * trace_marker with its CLOCK_MONOTONIC window, so that the script can list
 * the events inside that window. Then, as bench_stall does, a churn of
 * small blocks (--churn-ops, 1 M; 2 ms sleeps every 20,000) while the
 * allocator may be purging what the bulk free released, its slow mallocs
 * and frees marked the same way. It repeats --reps (5) times, pausing
 * 1.2 s between repetitions.
 *
 * A slow free with no guest event inside is time the guest did not see:
 * the hypervisor running something else on that vCPU.
 */
#include "bench_common.h"

#include <fcntl.h>
#include <sched.h>

#define SC "slow_free_trace"
#define CHURN_SLOTS 20000

static void mark(int marker, uint64_t rep, const char *what, size_t k, uint64_t from, uint64_t ns) {
    char m[160];
    int len = snprintf(m, sizeof m, "SLOW rep=%llu %s=%zu us=%.1f from=%.6f to=%.6f\n",
                       (unsigned long long)rep, what, k, (double)ns / 1e3, (double)from / 1e9,
                       (double)(from + ns) / 1e9);
    if (write(marker, m, (size_t)len) != len) perror("trace_marker");
}

int main(int argc, char **argv) {
    uint64_t mib = 512, block_kib = 64, slow_us = 50, reps = 5, cpu = 0, churn_ops = 1000000;
    for (int i = 1; i < argc; i++)
        if (!arg_u64(argc, argv, &i, "--mib", &mib) &&
            !arg_u64(argc, argv, &i, "--block-kib", &block_kib) &&
            !arg_u64(argc, argv, &i, "--slow-us", &slow_us) &&
            !arg_u64(argc, argv, &i, "--reps", &reps) && !arg_u64(argc, argv, &i, "--cpu", &cpu) &&
            !arg_u64(argc, argv, &i, "--churn-ops", &churn_ops)) {
            fprintf(stderr, "usage: slow_free_trace [--mib N] [--block-kib N] [--slow-us N] "
                            "[--reps N] [--cpu N] [--churn-ops N]\n");
            return 2;
        }
    bench_check_preload(SC);
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET((int)cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) {
        perror("sched_setaffinity");
        return 1;
    }
    int marker = open("/sys/kernel/tracing/trace_marker", O_WRONLY | O_CLOEXEC);
    if (marker < 0) {
        perror("/sys/kernel/tracing/trace_marker");
        return 1;
    }
    const size_t bs = (size_t)block_kib << 10, n = ((size_t)mib << 20) / bs;
    void **blocks = map_array(n * sizeof *blocks);
    uint32_t *order = map_array(n * sizeof *order);
    uint64_t rng = 0x5eed;
    void **slots = map_array(CHURN_SLOTS * sizeof *slots);
    for (size_t s = 0; s < CHURN_SLOTS; s++)
        if (!(slots[s] = malloc(16 + rng_next(&rng) % 497))) return 1;
    for (uint64_t rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < n; i++) {
            blocks[i] = malloc(bs);
            if (!blocks[i]) return 1;
            touch_pages(blocks[i], bs);
            order[i] = (uint32_t)i;
        }
        shuffle_u32(order, n, &rng);
        uint64_t slowest = 0;
        for (size_t k = 0; k < n; k++) {
            uint64_t a = now_ns();
            free(blocks[order[k]]);
            uint64_t d = now_ns() - a;
            if (d > slowest) slowest = d;
            if (d >= slow_us * 1000) mark(marker, rep, "free", k, a, d);
        }
        uint64_t churn_slowest = 0;
        for (uint64_t k = 0; k < churn_ops; k++) {
            size_t s = rng_next(&rng) % CHURN_SLOTS;
            uint64_t a = now_ns();
            free(slots[s]);
            uint64_t b = now_ns();
            slots[s] = malloc(16 + rng_next(&rng) % 497);
            uint64_t e = now_ns();
            if (!slots[s]) return 1;
            *(char *)slots[s] = 1;
            if (b - a >= slow_us * 1000) mark(marker, rep, "churn-free", k, a, b - a);
            if (e - b >= slow_us * 1000) mark(marker, rep, "churn-malloc", k, b, e - b);
            if (b - a > churn_slowest) churn_slowest = b - a;
            if (e - b > churn_slowest) churn_slowest = e - b;
            if ((k + 1) % 20000 == 0) sleep_ms(2);
        }
        printf("INFO %s rep %llu slowest free of the bulk free %.1f us, slowest call of the "
               "churn %.1f us\n",
               SC, (unsigned long long)rep, (double)slowest / 1e3, (double)churn_slowest / 1e3);
        sleep_ms(1200);
    }
    close(marker);
    return 0;
}
