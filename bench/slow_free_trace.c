/*
 * slow_free_trace.c: what happens on the CPU while one free() of a bulk free
 * is slow. Run by slow_free_trace.sh, which turns on kernel tracing of that
 * CPU (interrupts, IPIs, TLB flushes, page faults, context switches).
 *
 * The program pins itself to one CPU, allocates --mib MiB (512) of
 * --block-kib KiB (64) blocks, touches them, frees them in random order
 * and writes every free slower than --slow-us (50) to the kernel's
 * trace_marker with its CLOCK_MONOTONIC window, so that the script can list
 * the events inside that window. It repeats --reps (5) times, pausing
 * 1.2 s between repetitions (time-driven purges then land in the next one).
 *
 * A slow free with no guest event inside is time the guest did not see:
 * the hypervisor running something else on that vCPU.
 */
#include "bench_common.h"

#include <fcntl.h>
#include <sched.h>

#define SC "slow_free_trace"

int main(int argc, char **argv) {
    uint64_t mib = 512, block_kib = 64, slow_us = 50, reps = 5, cpu = 0;
    for (int i = 1; i < argc; i++)
        if (!arg_u64(argc, argv, &i, "--mib", &mib) &&
            !arg_u64(argc, argv, &i, "--block-kib", &block_kib) &&
            !arg_u64(argc, argv, &i, "--slow-us", &slow_us) &&
            !arg_u64(argc, argv, &i, "--reps", &reps) && !arg_u64(argc, argv, &i, "--cpu", &cpu)) {
            fprintf(stderr, "usage: slow_free_trace [--mib N] [--block-kib N] [--slow-us N] "
                            "[--reps N] [--cpu N]\n");
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
    for (uint64_t rep = 0; rep < reps; rep++) {
        for (size_t i = 0; i < n; i++) {
            blocks[i] = malloc(bs);
            if (!blocks[i]) return 1;
            touch_pages(blocks[i], bs);
            order[i] = (uint32_t)i;
        }
        for (size_t i = n - 1; i > 0; i--) {
            size_t j = rng_next(&rng) % (i + 1);
            uint32_t t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        uint64_t slowest = 0;
        for (size_t k = 0; k < n; k++) {
            uint64_t a = now_ns();
            free(blocks[order[k]]);
            uint64_t d = now_ns() - a;
            if (d > slowest) slowest = d;
            if (d < slow_us * 1000) continue;
            char m[160];
            int len = snprintf(m, sizeof m, "SLOW rep=%llu free=%zu us=%.1f from=%.6f to=%.6f\n",
                               (unsigned long long)rep, k, (double)d / 1e3, (double)a / 1e9,
                               (double)(a + d) / 1e9);
            if (write(marker, m, (size_t)len) != len) perror("trace_marker");
        }
        printf("INFO %s rep %llu slowest free %.1f us\n", SC, (unsigned long long)rep,
               (double)slowest / 1e3);
        sleep_ms(1200);
    }
    close(marker);
    return 0;
}
