/*
 * fork_exec.c: what starting a program costs a process that has a heap:
 * fork() + execve("/bin/true") + waitpid(), --iterations times (300), each
 * timed on its own.
 *
 * Before the loop the process builds a small heap (--heap-kib, 4 MiB, of
 * 16-1024 B blocks, every one written) and frees every other block, then
 * allocates as much again and frees all of it, so an allocator that purges
 * in the background has something to do; under lull its reclaim thread is
 * running throughout (that burst's emptied spans start it). Three kinds of
 * start, taken in turn (iteration i of each, then i + 1 of each), so that a
 * change of load on the machine hits all three alike:
 *
 *   forkexec        fork + execve with this process's environment: the child
 *                   preloads the allocator too (LD_PRELOAD is inherited, as
 *                   in a server started with it that runs a helper), so this
 *                   is fork, the child's start-up and exit under the
 *                   allocator, and waitpid;
 *   forkexec_clean  the same with LD_PRELOAD and BENCH_ALLOC removed from the
 *                   child's environment: /bin/true runs on glibc, what is left
 *                   is the parent's side (fork, the allocator's atfork
 *                   handlers, whatever the child does before it execs);
 *   spawn           posix_spawn with this process's environment: glibc
 *                   clones with CLONE_VM | CLONE_VFORK and runs no atfork
 *                   handler, the way to start a program that skips fork.
 *
 * Reports, per kind, the median, p90 and mean time of an iteration in us
 * (<kind>_us_median, ...); fork_us_median: the time until fork() returned
 * in the parent (forkexec's iterations); and rss_anon_mib, the resident
 * anonymous memory when the loop starts (fork copies its page tables).
 */
#include "bench_common.h"

#include <spawn.h>
#include <sys/wait.h>

#define SC "forkexec"
#define MAX_ENV 4096

extern char **environ;

enum { K_FORKEXEC, K_CLEAN, K_SPAWN, K_N };
static const char *const kind_name[K_N] = {"forkexec", "forkexec_clean", "spawn"};

static struct {
    uint64_t iterations;
    uint64_t heap_kib;
    const char *prog;
} cfg = {.iterations = 300, .heap_kib = 4096, .prog = "/bin/true"};

static char *clean_env[MAX_ENV];

/* environ without LD_PRELOAD and BENCH_ALLOC (no allocation: a static array) */
static void make_clean_env(void) {
    size_t n = 0;
    for (char **e = environ; *e && n + 1 < MAX_ENV; e++)
        if (strncmp(*e, "LD_PRELOAD=", 11) != 0 && strncmp(*e, "BENCH_ALLOC=", 12) != 0)
            clean_env[n++] = *e;
    clean_env[n] = NULL;
}


/* RssAnon (resident anonymous memory), in MiB. */
static double rss_anon_mib(void) {
    double kib = status_field("RssAnon:");
    return kib < 0 ? -1 : kib / 1024.0;
}

/* Waits for pid; returns 0 if it exited with status 0. */
static int reap(pid_t pid) {
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR) return -1;
    return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* One start of cfg.prog; returns the time it took in ns (0 on failure) and,
 * for the fork kinds, the time until fork() returned in *fork_ns. */
static uint64_t start_once(int kind, uint64_t *fork_ns) {
    char *argv[] = {(char *)cfg.prog, NULL};
    pid_t pid;
    uint64_t t0 = now_ns();
    if (kind == K_SPAWN) {
        if (posix_spawn(&pid, cfg.prog, NULL, NULL, argv, environ) != 0) return 0;
    } else {
        pid = fork();
        if (pid < 0) return 0;
        if (pid == 0) {
            execve(cfg.prog, argv, kind == K_CLEAN ? clean_env : environ);
            _exit(127);
        }
        *fork_ns = now_ns() - t0;
    }
    if (reap(pid) != 0) return 0;
    return now_ns() - t0;
}

/* One block of 16-1024 B, every byte written; its size in *size. */
static void *random_block(uint64_t *rng, int fill, size_t *size) {
    *size = 16 + (size_t)(rng_next(rng) % 1009);
    void *p = malloc(*size);
    if (!p) {
        fprintf(stderr, "malloc(%zu) failed\n", *size);
        exit(1);
    }
    memset(p, fill, *size);
    return p;
}

/* A heap of about heap_kib KiB of 16-1024 B blocks, every other one freed
 * again; the live ones stay for the process's life. Then a burst that
 * ended: as many bytes again, all freed, so that whole spans of free memory
 * wait to be purged (under lull this starts its reclaim thread, which a
 * process starts on first need). Returns live bytes. */
static uint64_t build_heap(void) {
    uint64_t want = cfg.heap_kib * 1024, got = 0, live = 0, rng = 12345;
    size_t cap = (size_t)(want / 16 + 1), n = 0, size;
    void **blocks = map_array(cap * sizeof *blocks);
    for (; got < want && n < cap; n++, got += size) {
        blocks[n] = random_block(&rng, 1, &size);
        if (n % 2) live += size; /* the odd ones stay */
    }
    for (size_t i = 0; i < n; i += 2)
        free(blocks[i]);
    for (n = 0, got = 0; got < want && n < cap; n++, got += size)
        blocks[n] = random_block(&rng, 2, &size);
    for (size_t i = 0; i < n; i++)
        free(blocks[i]);
    munmap(blocks, cap * sizeof *blocks);
    return live;
}

int main(int argc, char **argv) {
    int quick = 0;
    for (int i = 1; i < argc; i++) {
        if (arg_flag(argv, i, "--quick")) {
            quick = 1;
        } else if (!arg_u64(argc, argv, &i, "--iterations", &cfg.iterations) &&
                   !arg_u64(argc, argv, &i, "--heap-kib", &cfg.heap_kib) &&
                   !arg_value(argc, argv, &i, "--prog", &cfg.prog)) {
            fprintf(stderr, "usage: fork_exec [--quick] [--iterations N] [--heap-kib N] "
                            "[--prog PATH]\n");
            return 2;
        }
    }
    if (quick) cfg.iterations = 30;
    if (!cfg.iterations) return 2;
    bench_check_preload(SC);
    make_clean_env();
    uint64_t live = build_heap();
    printf("INFO %s config iterations=%llu prog=%s heap: %.1f MiB allocated, %.1f MiB live, "
           "rss %.1f MiB\n",
           SC, (unsigned long long)cfg.iterations, cfg.prog, (double)cfg.heap_kib / 1024.0,
           (double)live / BENCH_MIB, rss_mib());
    fflush(stdout);
    /* let background threads (lull's reclaim thread) get going */
    sleep_ms(100);
    /* fork copies the page tables of the anonymous memory: its cost grows
     * with this */
    double anon_mib = rss_anon_mib();
    printf("INFO %s threads %.0f (the allocator's background threads too)\n", SC,
           status_field("Threads:"));

    size_t n = (size_t)cfg.iterations;
    double *us[K_N], *fork_us = map_array(n * sizeof(double));
    for (int k = 0; k < K_N; k++)
        us[k] = map_array(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        for (int k = 0; k < K_N; k++) {
            uint64_t f = 0, t = start_once(k, &f);
            if (!t) {
                printf("ERROR %s %s of %s failed at iteration %zu: %s\n", SC, kind_name[k],
                       cfg.prog, i, strerror(errno));
                return 1;
            }
            us[k][i] = (double)t / 1e3;
            if (k == K_FORKEXEC) fork_us[i] = (double)f / 1e3;
        }
    }
    char m[64];
    for (int k = 0; k < K_N; k++) {
        double sum = 0;
        for (size_t i = 0; i < n; i++)
            sum += us[k][i];
        sort_doubles(us[k], n);
        snprintf(m, sizeof m, "%s_us_median", kind_name[k]);
        result(SC, m, median_doubles(us[k], n), "us");
        snprintf(m, sizeof m, "%s_us_p90", kind_name[k]);
        result(SC, m, quantile_sorted(us[k], n, 0.9), "us");
        snprintf(m, sizeof m, "%s_us_mean", kind_name[k]);
        result(SC, m, sum / (double)n, "us");
    }
    result(SC, "fork_us_median", median_doubles(fork_us, n), "us");
    result(SC, "rss_anon_mib", anon_mib, "MiB");
    return 0;
}
