/* NUMA topology, home node and segment binding on the host (one node here):
 * an injected four-node topology with asymmetric distances checks the
 * nearest-node order and the cpu->node map; the fallbacks (libnuma
 * "missing" through LULL_FAULT_NUMA, a one-node host) are checked for real.
 * Several nodes for real: tests/numa_guest (test_numa_guest). */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <dlfcn.h>
#include <errno.h>
#include <linux/mempolicy.h>
#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lull.h"
#include "numa/bind.h"
#include "numa/home_node.h"
#include "numa/topology.h"
#include "base/config.h"
#include "base/fault.h"
#include "tests/support/reexec.h"
#include "tests/support/text_lines.h"

/* Distances from row to column; asymmetric on purpose (d[0][1] = 30 but
 * d[1][0] = 15), with a tie in row 1 (nodes 0 and 3 both at 15). */
static const uint8_t dist4[4][4] = {
    {10, 30, 20, 25},
    {15, 10, 40, 15},
    {20, 35, 10, 12},
    {26, 14, 12, 10},
};

/* 8 CPUs: cpu c on node c / 2; node n has (n + 1) GiB. */
static void inject4(bool node3_has_memory) {
    static struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = 8;
    for (int c = 0; c < 8; c++)
        t.cpu_node[c] = (int16_t)(c / 2);
    for (int a = 0; a < 4; a++) {
        for (int b = 0; b < 4; b++)
            t.distance[a][b] = dist4[a][b];
        t.mem_total[a] = (uint64_t)(a + 1) << 30;
        t.mem_free[a] = t.mem_total[a] / 2;
    }
    if (!node3_has_memory) t.mem_total[3] = t.mem_free[3] = 0;
    cr_assert_eq(numa_topology_inject(&t), 0);
}

static void assert_order(int node, const int *want, int n) {
    int got[NUMA_MAX_NODES];
    int count = numa_nearest_nodes(node, got, NUMA_MAX_NODES);
    cr_assert_eq(count, n, "node %d: %d nodes, want %d", node, count, n);
    for (int i = 0; i < n; i++)
        cr_assert_eq(got[i], want[i], "node %d: order[%d] = %d, want %d", node, i, got[i], want[i]);
}

Test(numa_topology, injected_four_nodes_nearest_order) {
    inject4(true);
    cr_assert_str_eq(numa_topology_source(), "injected");
    cr_assert_eq(numa_node_count(), 4);
    cr_assert_eq(numa_topology()->max_node, 3);
    cr_assert_eq(numa_topology()->node_mask, 0xf);
    cr_assert_eq(numa_node_distance(0, 1), 30);
    cr_assert_eq(numa_node_distance(1, 0), 15);
    assert_order(0, (int[]){0, 2, 3, 1}, 4);
    assert_order(1, (int[]){1, 0, 3, 2}, 4); /* 0 and 3 tie at 15: lower id first */
    assert_order(2, (int[]){2, 3, 0, 1}, 4);
    assert_order(3, (int[]){3, 2, 1, 0}, 4);

    int two[2] = {-1, -1};
    cr_assert_eq(numa_nearest_nodes(3, two, 2), 2);
    cr_assert(two[0] == 3 && two[1] == 2);
    cr_assert_eq(numa_nearest_nodes(4, two, 2), -1, "node 4 does not exist");
    cr_assert_eq(numa_nearest_nodes(-1, two, 2), -1);
    cr_assert_eq(numa_nearest_nodes(0, two, 0), 0);
}

Test(numa_topology, memoryless_node_gets_nearest_memory_nodes) {
    inject4(false);
    cr_assert_eq(numa_topology()->mem_node_mask, 0x7);
    cr_assert(numa_node_present(3), "a CPU-only node is still a node");
    assert_order(3, (int[]){2, 1, 0}, 3);
    assert_order(0, (int[]){0, 2, 1}, 3);
}

Test(numa_topology, injected_cpu_to_node_map) {
    inject4(true);
    const struct numa_topology *t = numa_topology();
    cr_assert_eq(t->cpu_count, 8);
    for (int c = 0; c < 8; c++)
        cr_assert_eq(numa_cpu_node(c), c / 2, "cpu %d", c);
    cr_assert_eq(numa_cpu_node(8), -1, "beyond cpu_count");
    cr_assert_eq(numa_cpu_node(-1), -1);
    cr_assert_eq(numa_cpu_node(NUMA_MAX_CPUS), -1);
    for (int n = 0; n < 4; n++) {
        cr_assert_eq(t->node_cpu_count[n], 2);
        cr_assert_eq(t->node_cpus[n][0], 3ull << (2 * n), "node %d cpus %#llx", n,
                     (unsigned long long)t->node_cpus[n][0]);
        cr_assert_eq(t->mem_total[n], (uint64_t)(n + 1) << 30);
    }
    char buf[512];
    int len = numa_topology_format(buf, sizeof buf);
    cr_assert_gt(len, 0);
    cr_assert(strstr(buf, "nodes=4 source=injected"), "%s", buf);
    cr_assert(strstr(buf, "node1: cpus=2 mem=2G free=1G dist=15,10,40,15"), "%s", buf);
}

Test(numa_topology, inject_defaults_and_validation) {
    static struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = 2;
    t.cpu_node[0] = 0;
    t.cpu_node[1] = 5; /* sparse node ids */
    cr_assert_eq(numa_topology_inject(&t), 0);
    cr_assert_eq(numa_node_count(), 2);
    cr_assert_eq(numa_topology()->node_mask, (1ull << 0) | (1ull << 5));
    cr_assert_eq(numa_topology()->max_node, 5);
    cr_assert_eq(numa_node_distance(0, 0), NUMA_DISTANCE_LOCAL);
    cr_assert_eq(numa_node_distance(0, 5), NUMA_DISTANCE_REMOTE);
    cr_assert_eq(numa_node_distance(0, 1), 0, "node 1 is not present");
    assert_order(5, (int[]){5, 0}, 2);

    t.cpu_node[1] = NUMA_MAX_NODES;
    cr_assert_eq(numa_topology_inject(&t), -EINVAL);
    cr_assert_eq(numa_node_count(), 2, "a rejected injection changes nothing");
    t.cpu_node[1] = 1;
    t.cpu_count = NUMA_MAX_CPUS + 1;
    cr_assert_eq(numa_topology_inject(&t), -EINVAL);

    numa_topology_init();
    cr_assert_str_eq(numa_topology_source(), "injected", "init keeps an injection");
    cr_assert_eq(numa_topology_inject(NULL), 0);
    cr_assert_str_neq(numa_topology_source(), "injected");
}

/* The topology from libnuma and from sysfs describe the same machine. */
Test(numa_topology, libnuma_missing_falls_back_to_sysfs) {
    static struct numa_topology first;
    numa_topology_always_libnuma(true);
    numa_topology_init();
    first = *numa_topology();
    const char *src = numa_topology_source();
    if (strcmp(src, "libnuma") == 0) {
        cr_assert_str_eq(numa_topology_fallback_reason(), "");
    } else {
        cr_log_warn("libnuma.so.1 not usable here (%s): %s", src, numa_topology_fallback_reason());
        cr_assert_neq(numa_topology_fallback_reason()[0], '\0');
    }

    lull_fault_arm(LULL_FAULT_NUMA, -1);
    numa_topology_init();
    lull_fault_arm(LULL_FAULT_NUMA, 0);
    bool have_sysfs = access("/sys/devices/system/node/online", R_OK) == 0;
    cr_assert_str_eq(numa_topology_source(), have_sysfs ? "sysfs" : "single");
    cr_assert(strstr(numa_topology_fallback_reason(), "fault injected"), "reason: %s",
              numa_topology_fallback_reason());

    const struct numa_topology *t = numa_topology();
    cr_assert_eq(t->node_count, first.node_count);
    cr_assert_eq(t->node_mask, first.node_mask);
    cr_assert_eq(t->mem_node_mask, first.mem_node_mask);
    cr_assert_eq(t->cpu_count, first.cpu_count);
    for (int c = 0; c < t->cpu_count; c++)
        cr_assert_eq(t->cpu_node[c], first.cpu_node[c], "cpu %d", c);
    cr_assert_eq(memcmp(t->distance, first.distance, sizeof t->distance), 0);
    for (int n = 0; n < NUMA_MAX_NODES; n++)
        cr_assert_eq(t->mem_total[n], first.mem_total[n], "node %d", n);

    /* A one-shot fault: the next init loads libnuma again. */
    lull_fault_arm(LULL_FAULT_NUMA, 1);
    numa_topology_init();
    cr_assert_str_neq(numa_topology_source(), "libnuma");
    numa_topology_init();
    cr_assert_str_eq(numa_topology_source(), src);
    numa_topology_always_libnuma(false);
}

/* One possible node: the topology is read from sysfs, libnuma never loaded
 * (it cost every process start 250 us); several: libnuma's. */
Test(numa_topology, libnuma_loaded_only_with_several_possible_nodes) {
    char possible[64] = "";
    FILE *f = fopen("/sys/devices/system/node/possible", "r");
    if (!f || !fgets(possible, sizeof possible, f)) cr_skip_test("no /sys/devices/system/node");
    fclose(f);
    numa_topology_init();
    bool one = strcmp(possible, "0\n") == 0;
    cr_assert_str_eq(numa_topology_source(), one ? "sysfs" : "libnuma", "possible nodes %s",
                     possible);
    cr_assert_eq(dlopen("libnuma.so.1", RTLD_NOW | RTLD_NOLOAD) != NULL, !one,
                 "libnuma loaded with possible nodes %s", possible);
}

/* Before init: one node, every CPU on it, lull_current_node() is 0. */
Test(numa_topology, defaults_before_init) {
    if (strcmp(numa_topology_source(), "single") != 0)
        cr_skip_test("the library initialised the topology already (%s)", numa_topology_source());
    cr_assert_eq(numa_node_count(), 1);
    cr_assert_eq(numa_cpu_node(0), 0);
    cr_assert_eq(numa_cpu_node(NUMA_MAX_CPUS - 1), 0);
    cr_assert_eq(numa_node_distance(0, 0), 10);
    cr_assert_str_eq(home_node_source(), "single-node");
    cr_assert_eq(lull_current_node(), 0);
    int order[4];
    cr_assert_eq(numa_nearest_nodes(0, order, 4), 1);
    cr_assert_eq(order[0], 0);
}

static void *map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(p, MAP_FAILED);
    return p;
}

/* The host as it is. With one node (this machine) nothing needs choosing. */
Test(numa_topology, this_host) {
    int nodes = numa_topology_init();
    cr_assert_geq(nodes, 1);
    cr_assert_eq(numa_node_count(), nodes);
    home_node_init();
    int node = lull_current_node();
    cr_assert(numa_node_present(node), "node %d", node);
    unsigned cpu, knode;
    cr_assert_eq(getcpu(&cpu, &knode), 0);
    cr_assert_eq(numa_cpu_node((int)cpu), (int)knode, "the map agrees with the kernel");
    if (nodes == 1) {
        cr_assert_str_eq(home_node_source(), "single-node");
        cr_assert_eq(node, 0);
    }
    cr_log_info("host: %d node(s) from %s, home node from %s", nodes, numa_topology_source(),
                home_node_source());

    size_t len = 1 << 20;
    char *p = map(len);
    int r = numa_bind_segment(p, len, node, LULL_NUMA_LOCAL, 0);
    cr_assert(nodes == 1 ? r == 1 : r == 0, "bind: %d", r);
    int absent_page = numa_page_node(p);
    cr_assert(absent_page == -ENOENT || absent_page == -EFAULT, "not touched yet: %d", absent_page);
    memset(p, 1, len / 2);
    cr_assert_eq(numa_page_node(p + 4096), node);
    uint64_t counts[NUMA_MAX_NODES], absent = 0;
    cr_assert_eq(numa_pages_nodes(p, len, 0, counts, &absent), (long)(len / 4096));
    cr_assert_eq(counts[node], len / 2 / 4096);
    cr_assert_eq(absent, len / 2 / 4096);
    munmap(p, len);
}

/* Binding for real on the host's node 0 with a faked second node: the
 * policy the kernel records is the one asked for. */
Test(numa_topology, bind_sets_the_policy) {
    numa_topology_init();
    if (!numa_node_present(0)) cr_skip_test("the host has no node 0");
    static struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = 2;
    t.cpu_node[1] = 1;
    t.mem_total[0] = t.mem_total[1] = 1ull << 30;
    cr_assert_eq(numa_topology_inject(&t), 0);

    size_t len = 4 << 20;
    char *p = map(len);
    int mode = -1;
    uint64_t mask = 0;
    cr_assert_eq(numa_segment_policy(p, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_DEFAULT);

    cr_assert_eq(numa_bind_segment(p, len, 0, LULL_NUMA_LOCAL, 0), 0);
    cr_assert_eq(numa_segment_policy(p + len - 1, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_PREFERRED);
    cr_assert_eq(mask, 1);

    cr_assert_eq(numa_bind_segment(p, len, 0, LULL_NUMA_INTERLEAVE, 1), 0);
    cr_assert_eq(numa_segment_policy(p, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_INTERLEAVE);
    cr_assert_eq(mask, 1);

    cr_assert_eq(numa_bind_segment(p, len, 0, LULL_NUMA_BIND, 1), 0);
    cr_assert_eq(numa_segment_policy(p, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_BIND);
    cr_assert_eq(mask, 1);

    cr_assert_eq(numa_bind_segment(p, len, -1, LULL_NUMA_LOCAL, 0), 0);
    cr_assert_eq(numa_segment_policy(p, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_LOCAL);

    cr_assert_eq(numa_bind_segment(p, len, 0, LULL_NUMA_OFF, 0), 1);
    cr_assert_eq(numa_bind_segment(p + 1, len, 0, LULL_NUMA_LOCAL, 0), -EINVAL);
    cr_assert_eq(numa_bind_segment(p, 0, 0, LULL_NUMA_LOCAL, 0), -EINVAL);
    cr_assert_eq(numa_bind_segment(p, len, NUMA_MAX_NODES, LULL_NUMA_LOCAL, 0), -EINVAL);
    if (numa_topology_inject(NULL) == 0 && numa_node_count() == 1) {
        /* The kernel has no node 1: an error, and memory still works. */
        numa_topology_inject(&t);
        cr_assert_eq(numa_bind_segment(p, len, 1, LULL_NUMA_LOCAL, 0), -EINVAL);
        memset(p, 1, len);
    }
    munmap(p, len);
}

static bool pin(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) return false;
    for (int i = 0; i < 100 && sched_getcpu() != cpu; i++)
        sched_yield();
    return sched_getcpu() == cpu;
}

/* With an injected topology the home node is the fake node of the CPU the
 * thread runs on, whatever the mechanism. */
Test(numa_topology, home_node_follows_injected_map) {
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    static struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = CPU_SETSIZE < NUMA_MAX_CPUS ? CPU_SETSIZE : NUMA_MAX_CPUS;
    for (int c = 0; c < t.cpu_count; c++)
        t.cpu_node[c] = (int16_t)(c % 3);
    cr_assert_eq(numa_topology_inject(&t), 0);
    int mode = home_node_init();
    cr_assert(mode == LULL_HOME_RSEQ_CPU || mode == LULL_HOME_GETCPU, "mode %d (%s)", mode,
              home_node_source());

    const lull_home_mode_t modes[] = {LULL_HOME_RSEQ_CPU, LULL_HOME_GETCPU};
    int tried = 0;
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (home_node_set_mode(modes[m]) != 0) continue;
        for (int cpu = 0; cpu < t.cpu_count && cpu < 8; cpu++) {
            if (!CPU_ISSET(cpu, &allowed) || !pin(cpu)) continue;
            cr_assert_eq(lull_current_cpu(), cpu);
            cr_assert_eq(lull_current_node(), cpu % 3, "%s on cpu %d", home_node_source(), cpu);
            cr_assert(!lull_thread_migrated(cpu % 3));
            cr_assert(lull_thread_migrated((cpu + 1) % 3));
            tried++;
        }
    }
    cr_assert_gt(tried, 0, "no CPU could be pinned");
}

/* Every mechanism the host supports gives the kernel's node. */
Test(numa_topology, mechanisms_agree_with_the_kernel) {
    numa_topology_init();
    const lull_home_mode_t modes[] = {LULL_HOME_RSEQ_NODE, LULL_HOME_RSEQ_CPU, LULL_HOME_GETCPU};
    for (size_t m = 0; m < sizeof modes / sizeof modes[0]; m++) {
        if (home_node_set_mode(modes[m]) != 0) {
            cr_log_info("home node mechanism %d not available here", (int)modes[m]);
            continue;
        }
        unsigned cpu, node;
        cr_assert_eq(getcpu(&cpu, &node), 0);
        int got = lull_current_node();
        cr_assert_eq(got, (int)node, "%s: %d, kernel says %u", home_node_source(), got, node);
    }
    cr_assert_eq(home_node_set_mode((lull_home_mode_t)42), -EINVAL);
}

static void *other_thread_node(void *arg) {
    (void)arg;
    return (void *)(intptr_t)(lull_current_node() + 100 * (home_node_thread_override() + 1));
}

Test(numa_topology, thread_override) {
    inject4(true);
    home_node_init();
    cr_assert_eq(home_node_thread_override(), -1);
    cr_assert_eq(home_node_set_thread(3), 0);
    cr_assert_eq(lull_current_node(), 3);
    cr_assert_eq(home_node_thread_override(), 3);
    cr_assert(lull_thread_migrated(0));
    cr_assert_eq(home_node_set_thread(4), -EINVAL, "node 4 is not in the topology");
    cr_assert_eq(home_node_set_thread(-2), -EINVAL);
    cr_assert_eq(lull_current_node(), 3, "a refused override changes nothing");

    pthread_t th;
    void *ret;
    cr_assert_eq(pthread_create(&th, NULL, other_thread_node, NULL), 0);
    cr_assert_eq(pthread_join(th, &ret), 0);
    int other = (int)(intptr_t)ret;
    cr_assert_lt(other, 100, "the override is per thread (got %d)", other);

    cr_assert_eq(home_node_set_thread(-1), 0);
    cr_assert_eq(home_node_thread_override(), -1);
    unsigned cpu;
    cr_assert_eq(getcpu(&cpu, NULL), 0);
    int n = lull_current_node();
    cr_assert(n >= 0 && n < 4, "%d", n);
}

/* ---- the sysfs reader on a fake tree ---- */

static void put(const char *root, const char *rel, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s", root, rel);
    for (char *s = strchr(path + strlen(root) + 1, '/'); s; s = strchr(s + 1, '/')) {
        *s = '\0';
        mkdir(path, 0755);
        *s = '/';
    }
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f, "%s", path);
    fputs(text, f);
    fclose(f);
}

/* Nodes 0, 2 and 3 (sparse ids), node 3 without memory, asymmetric
 * distances, CPU lists in the kernel's list format. */
Test(numa_topology, sysfs_fake_tree) {
    char root[] = "/tmp/lull-fake-sysfs.XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    put(root, "devices/system/cpu/possible", "0-7\n");
    put(root, "devices/system/node/online", "0,2-3\n");
    put(root, "devices/system/node/has_memory", "0,2\n");
    put(root, "devices/system/node/node0/cpulist", "0-1,4\n");
    put(root, "devices/system/node/node2/cpulist", "2-3,6\n");
    put(root, "devices/system/node/node3/cpulist", "5,7\n");
    put(root, "devices/system/node/node0/distance", "10 21 31\n");
    put(root, "devices/system/node/node2/distance", "22 10 17\n");
    put(root, "devices/system/node/node3/distance", "32 16 10\n");
    put(root, "devices/system/node/node0/meminfo",
        "Node 0 MemTotal:        2097152 kB\nNode 0 MemFree:         1048576 kB\n"
        "Node 0 MemUsed:         1048576 kB\n");
    put(root, "devices/system/node/node2/meminfo",
        "Node 2 MemTotal:        1048576 kB\nNode 2 MemFree:          524288 kB\n");
    put(root, "devices/system/node/node3/meminfo",
        "Node 3 MemTotal:              0 kB\nNode 3 MemFree:               0 kB\n");

    cr_assert_eq(numa_topology_set_sysfs_root(root), 0);
    lull_fault_arm(LULL_FAULT_NUMA, -1);
    cr_assert_eq(numa_topology_init(), 3);
    cr_assert_str_eq(numa_topology_source(), "sysfs");
    const struct numa_topology *t = numa_topology();
    cr_assert_eq(t->node_mask, 0xdull);
    cr_assert_eq(t->mem_node_mask, 0x5ull);
    cr_assert_eq(t->max_node, 3);
    cr_assert_eq(t->cpu_count, 8);
    const int want_cpu[8] = {0, 0, 2, 2, 0, 3, 2, 3};
    for (int c = 0; c < 8; c++)
        cr_assert_eq(numa_cpu_node(c), want_cpu[c], "cpu %d", c);
    cr_assert_eq(t->node_cpu_count[0], 3);
    cr_assert_eq(t->node_cpu_count[3], 2);
    cr_assert_eq(numa_node_distance(0, 2), 21);
    cr_assert_eq(numa_node_distance(2, 0), 22);
    cr_assert_eq(numa_node_distance(3, 2), 16);
    cr_assert_eq(numa_node_distance(0, 1), 0);
    cr_assert_eq(t->mem_total[0], 2ull << 30);
    cr_assert_eq(t->mem_free[2], 512ull << 20);
    cr_assert_eq(t->mem_total[3], 0);
    assert_order(3, (int[]){2, 0}, 2); /* memoryless: nearest memory first */
    assert_order(0, (int[]){0, 2}, 2);

    /* The home node maps CPUs through this table only when injected; here
     * it is the kernel's own node. */
    home_node_init();
    cr_assert(lull_current_node() >= 0);

    /* No node directory at all: one node, and the reason says why. */
    char empty[] = "/tmp/lull-fake-sysfs.XXXXXX";
    cr_assert_not_null(mkdtemp(empty));
    put(empty, "devices/system/cpu/possible", "0-3\n");
    cr_assert_eq(numa_topology_set_sysfs_root(empty), 0);
    cr_assert_eq(numa_topology_init(), 1);
    cr_assert_str_eq(numa_topology_source(), "single");
    cr_assert(strstr(numa_topology_fallback_reason(), "devices/system/node"), "%s",
              numa_topology_fallback_reason());
    cr_assert_eq(numa_topology()->cpu_count, 4);
    cr_assert_eq(numa_topology()->node_cpu_count[0], 4);
    cr_assert_eq(numa_cpu_node(100), 0, "with one node every CPU is on it");
    home_node_init();
    cr_assert_str_eq(home_node_source(), "single-node");
    cr_assert_eq(numa_topology_set_sysfs_root(NULL), 0);
    lull_fault_arm(LULL_FAULT_NUMA, 0);

    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s' '%s'", root, empty);
    cr_assert_eq(system(cmd), 0);
}

/* Numbers past 64 bits in sysfs (a fake tree: the kernel writes none):
 * the reader wrapped them, so 2^64 + 1 was node 1, 2^64 + 3 CPU 3, and
 * 2^54 + 1 kB of memory was 1 KiB. A number that large is past every
 * limit: a node or CPU id too big to keep (ignored, as 70 is), the most
 * memory there can be. */
Test(numa_topology, sysfs_numbers_past_64_bits_are_not_wrapped) {
    char root[] = "/tmp/lull-fake-sysfs.XXXXXX";
    cr_assert_not_null(mkdtemp(root));
    put(root, "devices/system/cpu/possible", "0-3\n");
    put(root, "devices/system/node/online", "0,18446744073709551617\n");
    put(root, "devices/system/node/node0/cpulist", "0,18446744073709551619\n");
    put(root, "devices/system/node/node0/meminfo",
        "Node 0 MemTotal: 18014398509481985 kB\n"
        "Node 0 MemFree:  36893488147419103233 kB\n");
    cr_assert_eq(numa_topology_set_sysfs_root(root), 0);
    lull_fault_arm(LULL_FAULT_NUMA, -1);
    int nodes = numa_topology_init();
    const struct numa_topology *t = numa_topology();
    uint64_t mask = t->node_mask, total = t->mem_total[0], free_ = t->mem_free[0];
    int cpu3 = numa_cpu_node(3);
    cr_assert_eq(numa_topology_set_sysfs_root(NULL), 0);
    lull_fault_arm(LULL_FAULT_NUMA, 0);
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
    cr_assert_eq(system(cmd), 0);
    cr_assert_eq(nodes, 1, "node mask 0x%llx", (unsigned long long)mask);
    cr_assert_eq(mask, 1);
    cr_assert_eq(cpu3, -1, "2^64 + 3 was taken as CPU 3");
    cr_assert_eq(total, UINT64_MAX, "MemTotal %llu", (unsigned long long)total);
    cr_assert_eq(free_, UINT64_MAX, "MemFree %llu", (unsigned long long)free_);
    numa_topology_init();
}

Test(numa_topology, segment_hook_and_stats) {
    numa_topology_init();
    static struct numa_topology t;
    memset(&t, 0, sizeof t);
    t.cpu_count = 2;
    t.cpu_node[1] = 1;
    cr_assert_eq(numa_topology_inject(&t), 0);
    struct numa_bind_stats before, after;
    numa_bind_stats(&before);

    size_t len = 2 << 20;
    char *p = map(len);
    lull_config.numa = LULL_NUMA_LOCAL;
    lull_config.numa_nodes = 0;
    numa_segment_prepare(p, len, 0);
    int mode = -1;
    uint64_t mask = 0;
    cr_assert_eq(numa_segment_policy(p, &mode, &mask), 0);
    cr_assert_eq(mode, MPOL_PREFERRED);
    cr_assert_eq(mask, 1);
    lull_config.numa = LULL_NUMA_OFF;
    numa_segment_prepare(p, len, 0);
    cr_assert_eq(numa_bind_segment(p + 1, len, 0, LULL_NUMA_LOCAL, 0), -EINVAL);

    numa_bind_stats(&after);
    cr_assert_eq(after.bound, before.bound + 1);
    cr_assert_eq(after.skipped, before.skipped + 1);
    cr_assert_eq(after.failed, before.failed + 1);
    cr_assert_eq(after.last_error, -EINVAL);
    lull_config.numa = LULL_NUMA_LOCAL;
    munmap(p, len);
}

/* ------------------------------------------- numa_nodes that do not exist */

/* numa=bind or interleave with numa_nodes naming a node this machine does
 * not have (a configuration written for a bigger machine): one message at
 * start naming the node and what lull does instead. The nodes that exist
 * stay in force; when none is left, numa_nodes is the default (every node).
 * The scenario runs in a new process (its LULL_CONF is read at start): it
 * prints the node mask in force and allocates and touches memory. */
__attribute__((constructor(200))) static void numa_nodes_probe(void) {
    if (!getenv("LULL_TEST_NUMA_NODES_PROBE")) return;
    size_t len = 64 << 20;
    char *p = lull_malloc(len);
    if (p) memset(p, 1, len);
    printf("numa_nodes=%llu\nnuma=%d\nalloc_ok=%d\n", (unsigned long long)lull_config.numa_nodes,
           (int)lull_config.numa, p != NULL);
    lull_free(p);
    fflush(stdout);
    _exit(0);
}

/* A node id this machine does not have: 5 as in the report when it is
 * absent, else the first absent id above it. */
static int absent_node(void) {
    numa_topology_inject(NULL);
    uint64_t present = numa_topology()->node_mask;
    for (int n = 5; n < NUMA_MAX_NODES; n++)
        if (!(present >> n & 1)) return n;
    return -1;
}

static int lowest_memory_node(void) {
    uint64_t m = numa_topology()->mem_node_mask & numa_topology()->node_mask;
    return m ? __builtin_ctzll(m) : -1;
}

Test(numa_topology, numa_nodes_naming_an_absent_node_is_reported_once, .timeout = 120) {
    int absent = absent_node();
    if (absent < 0) cr_skip_test("every node id from 5 to 63 is present");
    char conf[128], want[96];
    snprintf(conf, sizeof conf, "LULL_CONF=numa=bind,numa_nodes=%d", absent);
    snprintf(want, sizeof want, "numa_nodes: node %d does not exist", absent);
    const char *vars[] = {"LULL_TEST_NUMA_NODES_PROBE=1", conf, NULL};
    child_run cr;
    reexec_run("numa_nodes_probe", vars, conf, 60000, &cr);
    reexec_assert_exited_0(&cr, conf);
    cr_assert_eq(count_lines_with(cr.err, want), 1, "%s: want one line \"%s\"; stderr:\n%s", conf,
                 want, cr.err);
    cr_assert_eq(count_lines_with(cr.err, "lull:"), 1, "%s: one message only; stderr:\n%s", conf,
                 cr.err);
    cr_assert(strstr(cr.err, "uses every node"), "%s: the outcome is not said: %s", conf, cr.err);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 0, "%s: numa_nodes in force should be all (0)",
                 conf);
    cr_assert_eq(reexec_field(&cr, "numa"), LULL_NUMA_BIND);
    cr_assert_eq(reexec_field(&cr, "alloc_ok"), 1);

    /* the same with interleave, and an existing node next to the absent one:
     * that one stays */
    int have = lowest_memory_node();
    cr_assert_geq(have, 0);
    snprintf(conf, sizeof conf, "LULL_CONF=numa=interleave,numa_nodes=%d:%d", have, absent);
    vars[1] = conf;
    reexec_run("numa_nodes_probe", vars, conf, 60000, &cr);
    reexec_assert_exited_0(&cr, conf);
    cr_assert_eq(count_lines_with(cr.err, want), 1, "%s: want one line \"%s\"; stderr:\n%s", conf,
                 want, cr.err);
    cr_assert_eq(count_lines_with(cr.err, "lull:"), 1, "%s: stderr:\n%s", conf, cr.err);
    char uses[48];
    snprintf(uses, sizeof uses, "uses node %d", have);
    cr_assert(strstr(cr.err, uses), "%s: want \"%s\" in: %s", conf, uses, cr.err);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 1ull << have, "%s", conf);
    cr_assert_eq(reexec_field(&cr, "alloc_ok"), 1);
}

/* numa_nodes is used by bind and interleave only: with numa=local it is
 * not checked (and not changed), and nodes that exist say nothing. */
Test(numa_topology, numa_nodes_of_existing_nodes_say_nothing, .timeout = 120) {
    int absent = absent_node();
    int have = lowest_memory_node();
    cr_assert_geq(have, 0);
    char conf[128];
    snprintf(conf, sizeof conf, "LULL_CONF=numa=bind,numa_nodes=%d", have);
    const char *vars[] = {"LULL_TEST_NUMA_NODES_PROBE=1", conf, NULL};
    child_run cr;
    reexec_run("numa_nodes_probe", vars, conf, 60000, &cr);
    reexec_assert_exited_0(&cr, conf);
    cr_assert_eq(count_lines_with(cr.err, "lull:"), 0, "%s: stderr:\n%s", conf, cr.err);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 1ull << have);
    if (absent < 0) return;
    snprintf(conf, sizeof conf, "LULL_CONF=numa=local,numa_nodes=%d", absent);
    reexec_run("numa_nodes_probe", vars, conf, 60000, &cr);
    reexec_assert_exited_0(&cr, conf);
    cr_assert_eq(count_lines_with(cr.err, "lull:"), 0, "%s: stderr:\n%s", conf, cr.err);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 1ull << absent);
}
