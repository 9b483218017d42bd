/*
 * numa_placement.c: where do a thread's pages end up when two threads on
 * two NUMA nodes trade objects? Run by bench/numa_placement.sh in a qemu
 * guest with two nodes (TCG: timings mean nothing there, only placement).
 *
 * One file, two programs:
 *
 *   the bench (default build, dynamic): two threads, pinned to a CPU of node
 *   0 and of node 1, run --rounds rounds. In each round a thread allocates
 *   --batch objects (16 B - 512 KiB, mostly small) and writes every byte;
 *   it keeps every other one in a ring of its last --keep objects (the
 *   oldest is freed by itself when the ring is full) and hands the rest to
 *   the other thread, which frees them (remote frees) before both go on.
 *   At the end each thread looks up the distinct pages of the objects in
 *   its ring with move_pages() and reports the share on its own node. The
 *   allocator arrives by LD_PRELOAD, as in the rest of bench/.
 *
 *   the launcher (-DNUMA_PLACEMENT_LAUNCHER, static): /init of the guest.
 *   Mounts /dev, /proc, /sys, runs /numa_placement once per line of
 *   /allocators ("name|LD_PRELOAD path or -|extra VAR=value ..."), with the
 *   arguments of /bench.args, and prints each run's result line on the
 *   console, then powers off.
 *
 * Output (bench): one line
 *   PLACEMENT alloc=NAME nodes=N cpu0=C node0=A pages0=P local0=PCT absent0=K
 *             cpu1=C node1=B pages1=P local1=PCT absent1=K rss_mib=M
 * and INFO lines. The launcher prefixes the lines it relays with
 * "NUMA-PLACEMENT: " (and "NUMA-PLACEMENT: RUN-FAILED NAME why" when a run
 * fails); numa_placement.sh makes the table.
 */
#define _GNU_SOURCE
#include "bench_common.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#ifndef NUMA_PLACEMENT_LAUNCHER

/* ---- the bench ------------------------------------------------------------ */

#define MAX_NODES 64

struct params {
    unsigned rounds, batch, keep;
    uint64_t seed;
};

struct worker {
    int index;
    int cpu, node;
    pthread_t thread;
    uint64_t rng;
    void **ring; /* the objects it keeps */
    size_t *ring_size;
    unsigned ring_len, ring_head;
    void **outbox; /* handed to the other thread this round */
    unsigned out_len;
    /* results */
    long pages;
    uint64_t on[MAX_NODES];
    uint64_t absent;
    int ok;
};

static struct params P = {24, 1000, 4000, 1};
static struct worker W[2];
static pthread_barrier_t step;

/* 16 B - 512 KiB: 70 % up to 512 B, 25 % up to 8 KiB, 4.5 % up to 64 KiB,
 * 0.5 % 128-512 KiB. */
static size_t draw_size(uint64_t *rng) {
    uint64_t r = rng_next(rng);
    unsigned u = (unsigned)(r % 1000);
    r >>= 10;
    if (u < 700) return 16 + r % 497;
    if (u < 950) return 512 + r % 7681;
    if (u < 995) return 8192 + r % (56 * 1024 + 1);
    return 128 * 1024 + r % (384 * 1024 + 1);
}

static bool pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) return false;
    for (int i = 0; i < 1000 && sched_getcpu() != cpu; i++)
        sched_yield();
    return sched_getcpu() == cpu;
}

static int cmp_uptr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Distinct pages of the ring's objects, counted per node. The page list is
 * mmap'ed: the measurement allocates nothing from the allocator. */
static void measure(struct worker *w) {
    size_t cap = 0;
    for (unsigned i = 0; i < w->ring_len; i++)
        cap += w->ring_size[i] / BENCH_PAGE + 2;
    size_t bytes = (cap * sizeof(uintptr_t) + BENCH_PAGE - 1) & ~(size_t)(BENCH_PAGE - 1);
    uintptr_t *pages = mmap(NULL, bytes ? bytes : BENCH_PAGE, PROT_READ | PROT_WRITE,
                            MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (pages == MAP_FAILED) return;
    size_t n = 0;
    for (unsigned i = 0; i < w->ring_len; i++) {
        uintptr_t a = (uintptr_t)w->ring[i] & ~(uintptr_t)(BENCH_PAGE - 1);
        uintptr_t end = (uintptr_t)w->ring[i] + w->ring_size[i];
        for (; a < end; a += BENCH_PAGE)
            pages[n++] = a;
    }
    qsort(pages, n, sizeof pages[0], cmp_uptr);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || pages[u - 1] != pages[i]) pages[u++] = pages[i];
    enum { BATCH = 512 };
    int status[BATCH];
    for (size_t i = 0; i < u; i += BATCH) {
        unsigned long k = u - i < BATCH ? u - i : BATCH;
        if (syscall(__NR_move_pages, 0, k, (void **)(pages + i), NULL, status, 0) < 0) {
            printf("INFO numa_placement move_pages failed: %s\n", strerror(errno));
            munmap(pages, bytes ? bytes : BENCH_PAGE);
            return;
        }
        for (unsigned long j = 0; j < k; j++) {
            if (status[j] >= 0 && status[j] < MAX_NODES)
                w->on[status[j]]++;
            else {
                w->absent++;
                if (w->absent <= 3)
                    printf("INFO numa_placement thread %d: page %#lx status %d\n", w->index,
                           (unsigned long)pages[i + j], status[j]);
            }
        }
    }
    w->pages = (long)u;
    w->ok = 1;
    munmap(pages, bytes ? bytes : BENCH_PAGE);
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct worker *other = &W[1 - w->index];
    if (!pin(w->cpu))
        printf("INFO numa_placement thread %d not pinned to cpu %d\n", w->index, w->cpu);
    unsigned char fill = (unsigned char)(0x40 + w->index);
    for (unsigned r = 0; r < P.rounds; r++) {
        w->out_len = 0;
        for (unsigned i = 0; i < P.batch; i++) {
            size_t size = draw_size(&w->rng);
            void *p = malloc(size);
            if (!p) {
                printf("INFO numa_placement malloc(%zu) failed\n", size);
                exit(4);
            }
            memset(p, fill, size);
            if (i & 1) {
                w->outbox[w->out_len++] = p;
                continue;
            }
            unsigned slot = (w->ring_head + w->ring_len) % P.keep;
            if (w->ring_len == P.keep) { /* full: the oldest goes (a local free) */
                slot = w->ring_head;
                free(w->ring[slot]);
                w->ring_head = (w->ring_head + 1) % P.keep;
                w->ring_len--;
            }
            w->ring[slot] = p;
            w->ring_size[slot] = size;
            w->ring_len++;
        }
        pthread_barrier_wait(&step);
        /* the other thread's objects: remote frees */
        for (unsigned i = 0; i < other->out_len; i++)
            free(other->outbox[i]);
        pthread_barrier_wait(&step);
    }
    /* Still alive, so its ring is measured as it is (and a thread cache of
     * the allocator is not flushed by a thread exit first). */
    measure(w);
    pthread_barrier_wait(&step);
    return NULL;
}

/* First CPU of node `node` from sysfs, -1 if none. */
static int node_first_cpu(int node) {
    char path[128], buf[256];
    snprintf(path, sizeof path, "/sys/devices/system/node/node%d/cpulist", node);
    if (read_proc_file(path, buf, sizeof buf) <= 0) return -1;
    char *end;
    long c = strtol(buf, &end, 10);
    return end == buf ? -1 : (int)c;
}

static int node_count(void) {
    int n = 0;
    for (int i = 0; i < MAX_NODES; i++) {
        char path[128];
        snprintf(path, sizeof path, "/sys/devices/system/node/node%d", i);
        if (access(path, F_OK) == 0) n++;
    }
    return n;
}

static void usage(void) {
    fprintf(stderr, "usage: numa_placement [--rounds N] [--batch N] [--keep N] [--seed N]\n");
    exit(2);
}

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        uint64_t v;
        if (arg_u64(argc, argv, &i, "--rounds", &v))
            P.rounds = (unsigned)v;
        else if (arg_u64(argc, argv, &i, "--batch", &v))
            P.batch = (unsigned)v;
        else if (arg_u64(argc, argv, &i, "--keep", &v))
            P.keep = (unsigned)v;
        else if (arg_u64(argc, argv, &i, "--seed", &v))
            P.seed = v;
        else
            usage();
    }
    if (P.rounds < 1 || P.batch < 2 || P.keep < 1) usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    bench_check_preload("numa_placement");
    const char *alloc = getenv("BENCH_ALLOC");

    int nodes = node_count();
    int cpus[2] = {node_first_cpu(0), node_first_cpu(1)};
    if (nodes < 2 || cpus[0] < 0 || cpus[1] < 0) {
        /* one node (a host run): still runs, on CPUs 0 and 1 */
        printf("INFO numa_placement only %d node(s): both threads count node 0 as their own\n",
               nodes);
        long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
        cpus[0] = 0;
        cpus[1] = ncpu > 1 ? 1 : 0;
    }
    pthread_barrier_init(&step, NULL, 2);
    for (int t = 0; t < 2; t++) {
        struct worker *w = &W[t];
        w->index = t;
        w->cpu = cpus[t];
        w->node = nodes >= 2 ? t : 0;
        w->rng = P.seed * 2 + (uint64_t)t + 1;
        size_t ring_bytes = (size_t)P.keep * (sizeof(void *) + sizeof(size_t));
        char *mem = mmap(NULL, ring_bytes + (size_t)P.batch * sizeof(void *),
                         PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (mem == MAP_FAILED) return 1;
        w->ring = (void **)mem;
        w->ring_size = (size_t *)(mem + (size_t)P.keep * sizeof(void *));
        w->outbox = (void **)(mem + ring_bytes);
    }
    for (int t = 0; t < 2; t++)
        if (pthread_create(&W[t].thread, NULL, worker_main, &W[t]) != 0) return 1;
    for (int t = 0; t < 2; t++)
        pthread_join(W[t].thread, NULL);
    if (!W[0].ok || !W[1].ok) return 1;

    printf("PLACEMENT alloc=%s nodes=%d", alloc ? alloc : "?", nodes);
    for (int t = 0; t < 2; t++) {
        struct worker *w = &W[t];
        double local = w->pages ? 100.0 * (double)w->on[w->node] / (double)w->pages : 0;
        printf(" cpu%d=%d node%d=%d pages%d=%ld local%d=%.2f absent%d=%llu", t, w->cpu, t, w->node,
               t, w->pages, t, local, t, (unsigned long long)w->absent);
    }
    printf(" rss_mib=%.1f rounds=%u batch=%u keep=%u\n", rss_mib(), P.rounds, P.batch, P.keep);
    return 0;
}

#else /* NUMA_PLACEMENT_LAUNCHER */

/* ---- the launcher (/init of the guest) ------------------------------------ */

#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>

#define TAG "NUMA-PLACEMENT: "

static void setup(void) {
    mkdir("/dev", 0755);
    mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
    int fd = open("/dev/console", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
    }
    mkdir("/proc", 0755);
    mount("proc", "/proc", "proc", 0, NULL);
    mkdir("/sys", 0755);
    mount("sysfs", "/sys", "sysfs", 0, NULL);
    mkdir("/tmp", 01777);
    mount("tmpfs", "/tmp", "tmpfs", 0, NULL);
    mkdir("/dev/shm", 01777);
    mount("tmpfs", "/dev/shm", "tmpfs", 0, NULL);
}

/* Split s at sep into at most max fields (in place). */
static int split(char *s, char sep, char **out, int max) {
    int n = 0;
    while (n < max) {
        out[n++] = s;
        char *e = strchr(s, sep);
        if (!e) break;
        *e = '\0';
        s = e + 1;
    }
    return n;
}

/* Run the bench under one allocator; relay its output. */
static void run_one(char *line, char **bench_args, int nargs) {
    char *f[3] = {NULL, NULL, NULL};
    int nf = split(line, '|', f, 3);
    const char *name = f[0];
    const char *preload = nf > 1 && strcmp(f[1], "-") != 0 ? f[1] : NULL;
    char *envp[32];
    int ne = 0;
    static char e_alloc[128], e_pre[512];
    snprintf(e_alloc, sizeof e_alloc, "BENCH_ALLOC=%s", name);
    envp[ne++] = e_alloc;
    envp[ne++] = "PATH=/";
    envp[ne++] = "LD_LIBRARY_PATH=/lib/x86_64-linux-gnu:/usr/lib/x86_64-linux-gnu";
    if (preload) {
        snprintf(e_pre, sizeof e_pre, "LD_PRELOAD=%s", preload);
        envp[ne++] = e_pre;
    }
    char *extra[16];
    int nx = nf > 2 && f[2][0] ? split(f[2], ' ', extra, 16) : 0;
    for (int i = 0; i < nx && ne < 31; i++)
        if (extra[i][0]) envp[ne++] = extra[i];
    envp[ne] = NULL;

    char *argv[40];
    int na = 0;
    argv[na++] = "/numa_placement";
    for (int i = 0; i < nargs && na < 39; i++)
        argv[na++] = bench_args[i];
    argv[na] = NULL;

    int fds[2];
    if (pipe(fds) != 0) {
        printf(TAG "RUN-FAILED %s pipe: %s\n", name, strerror(errno));
        return;
    }
    printf(TAG "START %s%s%s\n", name, preload ? " LD_PRELOAD=" : "", preload ? preload : "");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        close(fds[0]);
        dup2(fds[1], 1);
        dup2(fds[1], 2);
        close(fds[1]);
        alarm(900);
        execve(argv[0], argv, envp);
        printf("exec %s: %s\n", argv[0], strerror(errno));
        _exit(127);
    }
    close(fds[1]);
    char buf[4096];
    size_t have = 0;
    bool placed = false;
    for (;;) {
        ssize_t n = read(fds[0], buf + have, sizeof buf - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        have += (size_t)n;
        buf[have] = '\0';
        char *l = buf, *nl;
        while ((nl = strchr(l, '\n')) != NULL) {
            *nl = '\0';
            printf(TAG "%s%s\n", strncmp(l, "PLACEMENT ", 10) == 0 ? "" : "| ", l);
            if (strncmp(l, "PLACEMENT ", 10) == 0) placed = true;
            l = nl + 1;
        }
        have = strlen(l);
        memmove(buf, l, have);
        if (have == sizeof buf - 1) have = 0;
    }
    close(fds[0]);
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 || !placed) {
        if (WIFSIGNALED(st))
            printf(TAG "RUN-FAILED %s signal %d (%s)\n", name, WTERMSIG(st),
                   strsignal(WTERMSIG(st)));
        else
            printf(TAG "RUN-FAILED %s exit %d%s\n", name, WEXITSTATUS(st),
                   placed ? "" : ", no PLACEMENT line");
    }
    fflush(stdout);
}

int main(void) {
    bool pid1 = getpid() == 1;
    if (pid1) setup();
    setvbuf(stdout, NULL, _IOLBF, 0);
    static char args_text[1024], list[8192];
    char *bench_args[32];
    int nargs = 0;
    if (read_proc_file("/bench.args", args_text, sizeof args_text) > 0) {
        args_text[strcspn(args_text, "\n")] = '\0';
        for (char *save = NULL, *t = strtok_r(args_text, " ", &save); t && nargs < 32;
             t = strtok_r(NULL, " ", &save))
            bench_args[nargs++] = t;
    }
    char info[256] = "";
    read_proc_file("/proc/sys/kernel/osrelease", info, sizeof info);
    info[strcspn(info, "\n")] = '\0';
    char bal[32] = "?";
    if (read_proc_file("/proc/sys/kernel/numa_balancing", bal, sizeof bal) <= 0)
        snprintf(bal, sizeof bal, "?");
    bal[strcspn(bal, "\n")] = '\0';
    printf(TAG "BEGIN kernel=%s numa_balancing=%s\n", info, bal);
    if (read_proc_file("/allocators", list, sizeof list) <= 0) {
        printf(TAG "RUN-FAILED all no /allocators\n");
    } else {
        for (char *save = NULL, *l = strtok_r(list, "\n", &save); l;
             l = strtok_r(NULL, "\n", &save))
            if (*l && *l != '#') run_one(l, bench_args, nargs);
    }
    printf(TAG "END\n");
    fflush(stdout);
    if (pid1) {
        sync();
        reboot(RB_POWER_OFF);
        for (;;)
            pause();
    }
    return 0;
}

#endif /* NUMA_PLACEMENT_LAUNCHER */
