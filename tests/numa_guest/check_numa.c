/* Guest checks of lull's NUMA layer (numa/topology, numa/home_node,
 * numa/bind) on a real multi-node kernel. run.sh describes the machine on
 * the kernel command line:
 *   lull_guest.nodes=2            node count
 *   lull_guest.cpu_node=0,1       node of each CPU
 *   lull_guest.dist=10,21,21,10   distance matrix, row-major
 * Placement is measured with move_pages() page by page. */
#define _GNU_SOURCE
#include "guest.h"

#include "numa/bind.h"
#include "numa/home_node.h"
#include "numa/topology.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB (1024ul * 1024)

/* Parse "a,b,c" into out[]; returns the count. */
static int parse_ints(const char *s, int *out, int max) {
    int n = 0;
    while (s && *s && n < max) {
        char *end;
        long v = strtol(s, &end, 10);
        if (end == s) break;
        out[n++] = (int)v;
        s = *end == ',' ? end + 1 : end;
    }
    return n;
}

static int param_int(const char *key, int dflt) {
    char buf[32];
    const char *v = guest_param(key, buf, sizeof buf);
    return v ? atoi(v) : dflt;
}

/* First CPU of a node, -1 if it has none. */
static int node_cpu(int node) {
    const struct numa_topology *t = numa_topology();
    for (int c = 0; c < t->cpu_count; c++)
        if (t->cpu_node[c] == node) return c;
    return -1;
}

static double pct(uint64_t part, long whole) {
    return whole > 0 ? 100.0 * part / whole : 0;
}

GUEST_CHECK(topology) {
    int nodes = numa_topology_init();
    const struct numa_topology *t = numa_topology();
    char buf[2048];
    numa_topology_format(buf, sizeof buf);
    guest_info("%s", buf);
    guest_info("source=%s fallback_reason=\"%s\"", numa_topology_source(),
               numa_topology_fallback_reason());

    int want = param_int("nodes", 2);
    GUEST_REQUIRE(nodes == want, "%d nodes, want %d (%s)", nodes, want, buf);
    GUEST_REQUIRE(t->node_mask == (1ull << want) - 1, "node mask %#llx",
                  (unsigned long long)t->node_mask);
    GUEST_REQUIRE(strcmp(numa_topology_source(), "single") != 0, "source single: %s",
                  numa_topology_fallback_reason());

    char pbuf[256];
    int cpu_node[64];
    int ncpu = parse_ints(guest_param("cpu_node", pbuf, sizeof pbuf), cpu_node, 64);
    for (int c = 0; c < ncpu; c++)
        GUEST_REQUIRE(numa_cpu_node(c) == cpu_node[c], "cpu %d on node %d, want %d", c,
                      numa_cpu_node(c), cpu_node[c]);
    int dist[64 * 64];
    int nd = parse_ints(guest_param("dist", pbuf, sizeof pbuf), dist, 64 * 64);
    if (nd == want * want) {
        for (int a = 0; a < want; a++)
            for (int b = 0; b < want; b++)
                GUEST_REQUIRE(numa_node_distance(a, b) == dist[a * want + b],
                              "distance %d->%d is %d, want %d", a, b, numa_node_distance(a, b),
                              dist[a * want + b]);
    }
    for (int n = 0; n < want; n++) {
        GUEST_REQUIRE(t->mem_total[n] >= 128 * MIB, "node %d has %llu MiB", n,
                      (unsigned long long)(t->mem_total[n] / MIB));
        int order[NUMA_MAX_NODES];
        int k = numa_nearest_nodes(n, order, NUMA_MAX_NODES);
        GUEST_REQUIRE(k == want && order[0] == n, "nearest order of node %d starts at %d (%d)", n,
                      order[0], k);
    }
    guest_detail("%d nodes from %s, cpu->node %s, distances %s", nodes, numa_topology_source(),
                 ncpu ? "as configured" : "(not given)", nd ? "as configured" : "(not given)");
    return GUEST_PASS;
}

/* ---- home node ---- */

static int home_on_cpu(void *arg) {
    int cpu = (int)(intptr_t)arg;
    static const lull_home_mode_t modes[] = {LULL_HOME_RSEQ_NODE, LULL_HOME_RSEQ_CPU,
                                             LULL_HOME_GETCPU};
    int want = numa_cpu_node(cpu);
    unsigned kcpu, knode;
    if (getcpu(&kcpu, &knode) != 0 || (int)kcpu != cpu) {
        guest_detail("getcpu says cpu %u, pinned to %d", kcpu, cpu);
        return GUEST_FAIL;
    }
    if ((int)knode != want) {
        guest_detail("kernel puts cpu %d on node %u, topology on %d", cpu, knode, want);
        return GUEST_FAIL;
    }
    char seen[128] = "";
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (home_node_set_mode(modes[m]) != 0) continue;
        int got = lull_current_node();
        if (got != want) {
            guest_detail("cpu %d: %s says node %d, want %d", cpu, home_node_source(), got, want);
            return GUEST_FAIL;
        }
        size_t l = strlen(seen);
        snprintf(seen + l, sizeof seen - l, "%s%s", l ? "," : "", home_node_source());
    }
    home_node_init();
    guest_info("cpu %d -> node %d by %s (default %s)", cpu, want, seen, home_node_source());
    return GUEST_PASS;
}

static int migrate(void *arg) {
    (void)arg;
    int from = lull_current_node();
    int to_cpu = node_cpu(1 - from);
    if (to_cpu < 0) {
        guest_detail("no CPU on node %d", 1 - from);
        return GUEST_FAIL;
    }
    if (lull_thread_migrated(from)) {
        guest_detail("migrated before moving");
        return GUEST_FAIL;
    }
    if (!guest_pin_cpu(to_cpu)) {
        guest_detail("cannot move to cpu %d", to_cpu);
        return GUEST_FAIL;
    }
    if (!lull_thread_migrated(from) || lull_current_node() != 1 - from) {
        guest_detail("moved to cpu %d, home node still %d", to_cpu, lull_current_node());
        return GUEST_FAIL;
    }
    /* The thread-local override wins over the CPU. */
    home_node_set_thread(from);
    int over = lull_current_node();
    home_node_set_thread(-1);
    if (over != from) {
        guest_detail("override: %d, want %d", over, from);
        return GUEST_FAIL;
    }
    return GUEST_PASS;
}

GUEST_CHECK(home_node) {
    numa_topology_init();
    int mode = home_node_init();
    guest_info("home node mechanism: %s (mode %d)", home_node_source(), mode);
    GUEST_REQUIRE(mode != LULL_HOME_SINGLE, "single-node mode on a %d-node machine",
                  numa_node_count());
    for (int cpu = 0; cpu < numa_topology()->cpu_count; cpu++) {
        if (numa_cpu_node(cpu) < 0) continue;
        if (guest_on_cpu(cpu, home_on_cpu, (void *)(intptr_t)cpu) != GUEST_PASS) return GUEST_FAIL;
    }
    home_node_init();
    if (guest_on_cpu(node_cpu(0), migrate, NULL) != GUEST_PASS) return GUEST_FAIL;
    guest_detail("every CPU's thread sees its node by %s; migration and override detected",
                 home_node_source());
    return GUEST_PASS;
}

/* ---- placement ---- */

struct place {
    int node; /* the arena's node */
    lull_numa_policy policy;
    uint64_t mask;
    size_t len;
    int thp;    /* 1: MADV_HUGEPAGE, 0: MADV_NOHUGEPAGE (4 KiB pages) */
    int rc;     /* numa_bind_segment's result */
    long pages; /* examined */
    uint64_t counts[NUMA_MAX_NODES];
    uint64_t absent;
    uint64_t ms;
    long thp_kib; /* AnonHugePages of the process while the segment is mapped */
};

/* AnonHugePages of the process, KiB (-1 unknown). */
static long anon_huge_kib(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return -1;
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "AnonHugePages: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

/* The kernel turns THP off on machines under 512 MiB (this guest); the
 * admin may turn it back on, and init is the admin. */
static void enable_thp(void) {
    static bool done;
    if (done) return;
    done = true;
    int fd = open("/sys/kernel/mm/transparent_hugepage/enabled", O_WRONLY);
    if (fd < 0) return;
    if (write(fd, "madvise", 7) != 7) guest_info("cannot enable THP: %s", strerror(errno));
    close(fd);
}

static int place_fn(void *arg) {
    struct place *p = arg;
    if (p->thp) enable_thp();
    char *mem = guest_map(p->len);
    if (!mem) {
        guest_detail("mmap of %zu MiB failed", p->len / MIB);
        return GUEST_FAIL;
    }
    uint64_t t0 = guest_now_ms();
    madvise(mem, p->len, p->thp ? MADV_HUGEPAGE : MADV_NOHUGEPAGE);
    p->rc = numa_bind_segment(mem, p->len, p->node, p->policy, p->mask);
    guest_touch(mem, p->len);
    p->ms = guest_now_ms() - t0;
    p->pages = numa_pages_nodes(mem, p->len, 0, p->counts, &p->absent);
    p->thp_kib = anon_huge_kib();
    munmap(mem, p->len);
    return GUEST_PASS;
}

static const char *policy_name(lull_numa_policy p) {
    switch (p) {
    case LULL_NUMA_LOCAL:
        return "local";
    case LULL_NUMA_INTERLEAVE:
        return "interleave";
    case LULL_NUMA_BIND:
        return "bind";
    case LULL_NUMA_OFF:
        return "off";
    }
    return "?";
}

/* Map, bind, touch on a thread pinned to cpu; fill *p. */
static int place_on(int cpu, struct place *p) {
    if (cpu < 0) {
        guest_detail("no CPU for that node");
        return GUEST_FAIL;
    }
    if (guest_on_cpu(cpu, place_fn, p) != GUEST_PASS) return GUEST_FAIL;
    guest_info("cpu %d, %s node %d mask %#llx, %zu MiB%s: bind=%d, node0 %.1f%%, node1 %.1f%%, "
               "absent %llu of %ld pages, touched in %llu ms, AnonHugePages %ld kB",
               cpu, policy_name(p->policy), p->node, (unsigned long long)p->mask, p->len / MIB,
               p->thp ? " THP" : "", p->rc, pct(p->counts[0], p->pages),
               pct(p->counts[1], p->pages), (unsigned long long)p->absent, p->pages,
               (unsigned long long)p->ms, p->thp_kib);
    if (p->rc != 0) {
        guest_detail("numa_bind_segment returned %d (%s)", p->rc, strerror(-p->rc));
        return GUEST_FAIL;
    }
    if (p->pages != (long)(p->len / 4096) || p->absent) {
        guest_detail("%ld pages examined, %llu absent", p->pages, (unsigned long long)p->absent);
        return GUEST_FAIL;
    }
    return GUEST_PASS;
}

/* A thread on each node's CPU binds (local policy) and touches a segment:
 * >= 99% of its pages are on that node. */
GUEST_CHECK(local_placement) {
    numa_topology_init();
    char out[256] = "";
    for (int thp = 0; thp <= 1; thp++) {
        for (int node = 0; node < numa_node_count(); node++) {
            struct place p = {.node = node, .policy = LULL_NUMA_LOCAL, .len = 16 * MIB, .thp = thp};
            if (place_on(node_cpu(node), &p) != GUEST_PASS) return GUEST_FAIL;
            double on = pct(p.counts[node], p.pages);
            GUEST_REQUIRE(on >= 99.0, "node %d%s: only %.2f%% of the pages on it", node,
                          thp ? " THP" : "", on);
            size_t l = strlen(out);
            snprintf(out + l, sizeof out - l, "%snode%d%s %.2f%%", l ? ", " : "", node,
                     thp ? " THP" : "", on);
        }
    }
    guest_detail("local pages: %s", out);
    return GUEST_PASS;
}

/* The policy, not first touch, decides: a thread on node 0 touching a
 * segment of node 1's arena gets node 1 pages. */
GUEST_CHECK(remote_arena_placement) {
    numa_topology_init();
    double on[2];
    for (int thp = 0; thp <= 1; thp++) {
        struct place p = {.node = 1, .policy = LULL_NUMA_LOCAL, .len = 8 * MIB, .thp = thp};
        if (place_on(node_cpu(0), &p) != GUEST_PASS) return GUEST_FAIL;
        on[thp] = pct(p.counts[1], p.pages);
        GUEST_REQUIRE(on[thp] >= 99.0, "only %.2f%% on node 1%s", on[thp], thp ? " (THP)" : "");
    }
    /* Control: the same without a policy follows the touching CPU. */
    struct place c = {.node = 1, .policy = LULL_NUMA_OFF, .len = 8 * MIB};
    guest_on_cpu(node_cpu(0), place_fn, &c);
    guest_detail("node-1 segment touched from node 0: %.2f%% on node 1, THP %.2f%% (no policy: "
                 "%.2f%%)",
                 on[0], on[1], pct(c.counts[1], c.pages));
    return GUEST_PASS;
}

GUEST_CHECK(interleave) {
    numa_topology_init();
    struct place p = {.node = 0, .policy = LULL_NUMA_INTERLEAVE, .len = 8 * MIB};
    if (place_on(node_cpu(0), &p) != GUEST_PASS) return GUEST_FAIL;
    double n0 = pct(p.counts[0], p.pages), n1 = pct(p.counts[1], p.pages);
    GUEST_REQUIRE(n0 >= 40 && n1 >= 40, "interleave gave %.1f%% / %.1f%%", n0, n1);
    guest_detail("interleaved %.1f%% / %.1f%%", n0, n1);
    return GUEST_PASS;
}

/* Strict binding to the other node, and a two-node binding whose home node
 * (set_mempolicy_home_node) is the arena's node. Before 6.7 the kernel's
 * THP path ignores the home node (huge pages come from the faulting CPU's
 * node when the mask allows it), so the home node is checked with 4 KiB
 * pages and the THP result is only reported. */
GUEST_CHECK(bind_policy) {
    numa_topology_init();
    struct place p = {
        .node = 1, .policy = LULL_NUMA_BIND, .mask = 1ull << 1, .len = 8 * MIB, .thp = 1};
    if (place_on(node_cpu(0), &p) != GUEST_PASS) return GUEST_FAIL;
    GUEST_REQUIRE(p.counts[1] == (uint64_t)p.pages, "bind {1}: %.2f%% on node 1",
                  pct(p.counts[1], p.pages));
    struct place h = {.node = 1, .policy = LULL_NUMA_BIND, .mask = 3, .len = 8 * MIB};
    if (place_on(node_cpu(0), &h) != GUEST_PASS) return GUEST_FAIL;
    double home = pct(h.counts[1], h.pages);
    GUEST_REQUIRE(home >= 99.0, "bind {0,1} home node 1 from node 0: %.2f%% on node 1", home);
    struct place ht = {.node = 1, .policy = LULL_NUMA_BIND, .mask = 3, .len = 8 * MIB, .thp = 1};
    if (place_on(node_cpu(0), &ht) != GUEST_PASS) return GUEST_FAIL;
    guest_detail("bind {1}: 100%% on node 1; bind {0,1} home 1, touched on node 0: %.2f%% on "
                 "node 1 (THP: %.2f%%)",
                 home, pct(ht.counts[1], ht.pages));
    return GUEST_PASS;
}

/* MPOL_PREFERRED falls back instead of failing: a segment for node 1 larger
 * than node 1's free memory fills node 1, then takes node 0's memory, with
 * no OOM kill. */
GUEST_CHECK_TIMEOUT(preferred_fallback, 180) {
    numa_topology_init();
    const struct numa_topology *t = numa_topology();
    uint64_t free0 = t->mem_free[0], free1 = t->mem_free[1];
    size_t len = (size_t)((free1 + 48 * MIB) & ~(MIB - 1));
    if (free0 < (len - free1) + 96 * MIB) {
        guest_detail("not enough free memory on node 0 (%llu MiB) for the overflow",
                     (unsigned long long)(free0 / MIB));
        return GUEST_SKIP;
    }
    char tbuf[8];
    int thp = guest_param("fallback_thp", tbuf, sizeof tbuf) ? atoi(tbuf) : 0;
    struct place p = {.node = 1, .policy = LULL_NUMA_LOCAL, .len = len, .thp = thp};
    if (place_on(node_cpu(1), &p) != GUEST_PASS) return GUEST_FAIL;
    uint64_t on1 = p.counts[1] * 4096, on0 = p.counts[0] * 4096;
    GUEST_REQUIRE(on1 >= free1 * 3 / 4, "only %llu of %llu free MiB of node 1 used",
                  (unsigned long long)(on1 / MIB), (unsigned long long)(free1 / MIB));
    GUEST_REQUIRE(on0 >= 16 * MIB, "only %llu MiB spilled to node 0",
                  (unsigned long long)(on0 / MIB));
    guest_detail("%zu MiB for node 1 (%llu MiB free): %llu MiB on node 1, %llu MiB fell back to "
                 "node 0",
                 len / MIB, (unsigned long long)(free1 / MIB), (unsigned long long)(on1 / MIB),
                 (unsigned long long)(on0 / MIB));
    return GUEST_PASS;
}

GUEST_CHECK(page_node_api) {
    numa_topology_init();
    char *p = guest_map(2 * 4096);
    GUEST_REQUIRE(p, "mmap failed");
    GUEST_REQUIRE(numa_bind_segment(p, 2 * 4096, 1, LULL_NUMA_BIND, 1ull << 1) == 0, "bind");
    /* Not present: -ENOENT, or -EFAULT before 6.x (follow_page FOLL_DUMP). */
    int r = numa_page_node(p);
    GUEST_REQUIRE(r == -ENOENT || r == -EFAULT, "untouched page: %d", r);
    p[0] = 1;
    GUEST_REQUIRE(numa_page_node(p + 100) == 1, "touched page on node %d", numa_page_node(p));
    int mode = -1;
    uint64_t mask = 0;
    GUEST_REQUIRE(numa_segment_policy(p, &mode, &mask) == 0 && mask == 2, "policy %d mask %#llx",
                  mode, (unsigned long long)mask);
    munmap(p, 2 * 4096);
    GUEST_REQUIRE(numa_page_node(p) < 0, "unmapped page: %d", numa_page_node(p));
    guest_detail("move_pages and get_mempolicy report as expected");
    return GUEST_PASS;
}
