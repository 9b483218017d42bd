/* NUMA topology detection; see topology.h.
 *
 * Nothing here calls malloc or buffered stdio: files are read with
 * open/read/close into stack buffers. Only numa_topology_init() may
 * allocate, inside dlopen and libnuma. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "numa/topology.h"
#include "base/decimal.h"
#include "base/fault.h"
#include "base/message.h"
#include "base/fork_exec.h"
#include "base/text_file.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/mempolicy.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The topology before init: node 0 owns every CPU (cpu_node all 0). */
static struct numa_topology topo_single = {
    .source = NUMA_SOURCE_SINGLE,
    .node_count = 1,
    .max_node = 0,
    .cpu_count = NUMA_MAX_CPUS,
    .node_mask = 1,
    .mem_node_mask = 1,
    .distance = {{NUMA_DISTANCE_LOCAL}},
};
static struct numa_topology topo_detected;
static struct numa_topology topo_injected;
static const struct numa_topology *topo_saved = &topo_single; /* restored by inject(NULL) */
const struct numa_topology *lull_numa_current = &topo_single;

static char fallback_reason[256] = "not initialised";
static char saved_reason[256] = "not initialised";

/* Strings put together without printf: every process's first malloc
 * reads the topology, and printf's code was 2 of the 16 page faults a
 * small 4-thread program took in libc's text (each maps up to 16 pages
 * around it). */

/* s appended to dst[0..at), cut to fit cap with its NUL; the new length. */
static size_t append(char *dst, size_t cap, size_t at, const char *s) {
    while (*s && at + 1 < cap)
        dst[at++] = *s++;
    if (at < cap) dst[at] = 0;
    return at;
}

/* n >= 0 in decimal, appended as append() does. */
static size_t append_uint(char *dst, size_t cap, size_t at, unsigned n) {
    char digits[24];
    lull_format_u64(digits, n);
    return append(dst, cap, at, digits);
}

static void set_reason(const char *a, const char *b) {
    size_t at = append(fallback_reason, sizeof fallback_reason, 0, a);
    if (b && *b)
        append(fallback_reason, sizeof fallback_reason,
               append(fallback_reason, sizeof fallback_reason, at, ": "), b);
}

/* ---- small parsing helpers (no allocation) ---- */

/* Parse a kernel list ("0-3,8,10-11\n", also "0-15:2/4") and call set(i)
 * for each member below limit. Returns the number of members, -1 on a
 * syntax error. */
static int parse_list(const char *s, unsigned long limit, void (*set)(void *, unsigned long),
                      void *arg) {
    int count = 0;
    while (*s == ' ' || *s == '\t')
        s++;
    while (*s && *s != '\n') {
        unsigned long a, b, stride = 1, group = 0;
        s = lull_parse_ulong(s, &a);
        if (!s) return -1;
        b = a;
        if (*s == '-') {
            s = lull_parse_ulong(s + 1, &b);
            if (!s || b < a) return -1;
            if (*s == ':') { /* used_size/group_size */
                unsigned long used;
                s = lull_parse_ulong(s + 1, &used);
                if (!s || *s != '/') return -1;
                s = lull_parse_ulong(s + 1, &group);
                if (!s || group == 0 || used == 0) return -1;
                stride = used;
            }
        }
        for (unsigned long i = a; i <= b && i < limit; i++) {
            if (group && (i - a) % group >= stride) continue;
            set(arg, i);
            count++;
        }
        if (*s == ',')
            s++;
        else if (*s && *s != '\n')
            return -1;
    }
    return count;
}

static void set_mask_bit(void *arg, unsigned long i) {
    *(uint64_t *)arg |= 1ull << i;
}

struct cpu_set_arg {
    struct numa_topology *t;
    int node;
};

static void set_cpu_node(void *arg, unsigned long cpu) {
    struct cpu_set_arg *a = arg;
    a->t->cpu_node[cpu] = (int16_t)a->node;
}

static void set_max(void *arg, unsigned long i) {
    unsigned long *m = arg;
    if (i + 1 > *m) *m = i + 1;
}

/* "/sys", or a fake tree for tests (numa_topology_set_sysfs_root). */
static LULL_FORK_EXEC_DATA char sysfs_root[128] = "/sys"; /* the constructor reads it */

/* Read <sysfs_root>/<rel>, where a "%d" in rel stands for n (>= 0). */
static int read_sysfs(const char *rel, int n, char *buf, size_t size) {
    char path[256];
    size_t at = append(path, sizeof path, 0, sysfs_root);
    at = append(path, sizeof path, at, "/");
    const char *hole = strstr(rel, "%d");
    size_t head = hole ? (size_t)(hole - rel) : strlen(rel);
    if (at + head >= sizeof path) return -ENAMETOOLONG;
    memcpy(path + at, rel, head);
    at += head;
    path[at] = 0;
    if (hole)
        at = append(path, sizeof path, append_uint(path, sizeof path, at, (unsigned)n), hole + 2);
    if (at + 1 >= sizeof path) return -ENAMETOOLONG; /* cut short */
    return lull_read_text_file(path, buf, size);
}

static int possible_cpus(void) {
    char buf[1024];
    unsigned long max = 0;
    if (read_sysfs("devices/system/cpu/possible", 0, buf, sizeof buf) > 0 &&
        parse_list(buf, NUMA_MAX_CPUS, set_max, &max) > 0)
        return (int)max;
    return 0;
}

/* Derive the summary fields from cpu_node, node_mask and mem_total. */
static void finish(struct numa_topology *t) {
    t->node_count = __builtin_popcountll(t->node_mask);
    t->max_node = t->node_mask ? 63 - __builtin_clzll(t->node_mask) : 0;
    memset(t->node_cpu_count, 0, sizeof t->node_cpu_count);
    memset(t->node_cpus, 0, sizeof t->node_cpus);
    for (int c = 0; c < NUMA_MAX_CPUS; c++) {
        int n = t->cpu_node[c];
        if (n < 0 || n >= NUMA_MAX_NODES) continue;
        t->node_cpu_count[n]++;
        t->node_cpus[n][c / 64] |= 1ull << (c % 64);
    }
    for (int a = 0; a < NUMA_MAX_NODES; a++) {
        for (int b = 0; b < NUMA_MAX_NODES; b++) {
            bool present = (t->node_mask >> a & 1) && (t->node_mask >> b & 1);
            if (!present)
                t->distance[a][b] = 0;
            else if (t->distance[a][b] == 0)
                t->distance[a][b] = a == b ? NUMA_DISTANCE_LOCAL : NUMA_DISTANCE_REMOTE;
        }
    }
}

static void reset(struct numa_topology *t, numa_source source) {
    memset(t, 0, sizeof *t);
    t->source = source;
    for (int c = 0; c < NUMA_MAX_CPUS; c++)
        t->cpu_node[c] = -1;
}

/* ---- sysfs ---- */

#define NODE_DIR "devices/system/node"

static int detect_sysfs(struct numa_topology *t) {
    char buf[8192];
    reset(t, NUMA_SOURCE_SYSFS);

    int r = read_sysfs(NODE_DIR "/online", 0, buf, sizeof buf);
    if (r < 0) r = read_sysfs(NODE_DIR "/possible", 0, buf, sizeof buf);
    if (r < 0) return r;
    uint64_t mask = 0;
    if (parse_list(buf, NUMA_MAX_NODES, set_mask_bit, &mask) <= 0) return -EINVAL;
    t->node_mask = mask;

    for (int n = 0; n < NUMA_MAX_NODES; n++) {
        if (!(mask >> n & 1)) continue;
        if (read_sysfs(NODE_DIR "/node%d/cpulist", n, buf, sizeof buf) >= 0) {
            struct cpu_set_arg a = {t, n};
            if (parse_list(buf, NUMA_MAX_CPUS, set_cpu_node, &a) < 0)
                lull_verbose("numa: cannot parse node%d/cpulist", n);
        }
        /* One distance per online node, in node-id order. */
        if (read_sysfs(NODE_DIR "/node%d/distance", n, buf, sizeof buf) > 0) {
            const char *p = buf;
            for (int m = 0; m < NUMA_MAX_NODES && *p; m++) {
                if (!(mask >> m & 1)) continue;
                while (*p == ' ')
                    p++;
                unsigned long d;
                const char *q = lull_parse_ulong(p, &d);
                if (!q) break;
                t->distance[n][m] = d > 255 ? 255 : (uint8_t)d;
                p = q;
            }
        }
        if (read_sysfs(NODE_DIR "/node%d/meminfo", n, buf, sizeof buf) > 0) {
            t->mem_total[n] = lull_meminfo_bytes(buf, "MemTotal");
            t->mem_free[n] = lull_meminfo_bytes(buf, "MemFree");
        }
    }
    uint64_t mem_mask = 0;
    if (read_sysfs(NODE_DIR "/has_memory", 0, buf, sizeof buf) > 0 &&
        parse_list(buf, NUMA_MAX_NODES, set_mask_bit, &mem_mask) > 0)
        t->mem_node_mask = mem_mask & mask;
    else
        for (int n = 0; n < NUMA_MAX_NODES; n++)
            if (t->mem_total[n]) t->mem_node_mask |= 1ull << n;
    if (!t->mem_node_mask) t->mem_node_mask = mask;

    t->cpu_count = possible_cpus();
    for (int c = 0; c < NUMA_MAX_CPUS; c++)
        if (t->cpu_node[c] >= 0 && c + 1 > t->cpu_count) t->cpu_count = c + 1;
    finish(t);
    return 0;
}

/* ---- libnuma (dlopen) ---- */

struct bitmask; /* libnuma's, opaque here */

struct libnuma_fns {
    int (*available)(void);
    int (*max_node)(void);
    long long (*node_size64)(int, long long *);
    int (*distance)(int, int);
    int (*num_configured_cpus)(void);
    int (*node_of_cpu)(int);
    int (*bitmask_isbitset)(const struct bitmask *, unsigned int);
    struct bitmask **nodes_ptr;
    struct bitmask **memnodes_ptr; /* numa_all_nodes_ptr: nodes with memory we may use */
};

static void *libnuma_handle;

static int detect_libnuma(struct numa_topology *t) {
    if (!libnuma_handle) {
        libnuma_handle = dlopen("libnuma.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!libnuma_handle) {
            const char *e = dlerror();
            set_reason("dlopen libnuma.so.1 failed", e ? e : "unknown error");
            return -ENOENT;
        }
    }
    struct libnuma_fns f;
    void *h = libnuma_handle;
    *(void **)&f.available = dlsym(h, "numa_available");
    *(void **)&f.max_node = dlsym(h, "numa_max_node");
    *(void **)&f.node_size64 = dlsym(h, "numa_node_size64");
    *(void **)&f.distance = dlsym(h, "numa_distance");
    *(void **)&f.num_configured_cpus = dlsym(h, "numa_num_configured_cpus");
    *(void **)&f.node_of_cpu = dlsym(h, "numa_node_of_cpu");
    *(void **)&f.bitmask_isbitset = dlsym(h, "numa_bitmask_isbitset");
    f.nodes_ptr = dlsym(h, "numa_nodes_ptr");
    f.memnodes_ptr = dlsym(h, "numa_all_nodes_ptr");
    if (!f.available || !f.max_node || !f.node_size64 || !f.distance || !f.num_configured_cpus ||
        !f.node_of_cpu) {
        set_reason("libnuma.so.1 lacks a needed symbol", "");
        return -ENOSYS;
    }
    if (f.available() < 0) {
        set_reason("numa_available() < 0", "the kernel reports no NUMA support");
        return -ENOSYS;
    }
    reset(t, NUMA_SOURCE_LIBNUMA);
    int maxn = f.max_node();
    if (maxn < 0) maxn = 0;
    if (maxn >= NUMA_MAX_NODES) {
        lull_message("numa: %d nodes, only the first %d are used", maxn + 1, NUMA_MAX_NODES);
        maxn = NUMA_MAX_NODES - 1;
    }
    for (int n = 0; n <= maxn; n++) {
        long long fr = 0, sz;
        if (f.nodes_ptr && *f.nodes_ptr && f.bitmask_isbitset) {
            if (!f.bitmask_isbitset(*f.nodes_ptr, (unsigned)n)) continue;
            sz = f.node_size64(n, &fr);
        } else {
            sz = f.node_size64(n, &fr);
            if (sz < 0) continue;
        }
        t->node_mask |= 1ull << n;
        if (sz > 0) {
            t->mem_total[n] = (uint64_t)sz;
            t->mem_free[n] = fr > 0 ? (uint64_t)fr : 0;
        }
    }
    if (!t->node_mask) t->node_mask = 1;
    for (int a = 0; a <= maxn; a++) {
        if (!(t->node_mask >> a & 1)) continue;
        for (int b = 0; b <= maxn; b++) {
            if (!(t->node_mask >> b & 1)) continue;
            int d = f.distance(a, b);
            t->distance[a][b] = d <= 0 ? 0 : d > 255 ? 255 : (uint8_t)d;
        }
        if (f.memnodes_ptr && *f.memnodes_ptr && f.bitmask_isbitset) {
            if (f.bitmask_isbitset(*f.memnodes_ptr, (unsigned)a) && t->mem_total[a])
                t->mem_node_mask |= 1ull << a;
        } else if (t->mem_total[a]) {
            t->mem_node_mask |= 1ull << a;
        }
    }
    if (!t->mem_node_mask) t->mem_node_mask = t->node_mask;
    int ncpu = f.num_configured_cpus();
    int possible = possible_cpus();
    if (possible > ncpu) ncpu = possible;
    if (ncpu > NUMA_MAX_CPUS) {
        lull_message("numa: %d CPUs, only the first %d are mapped", ncpu, NUMA_MAX_CPUS);
        ncpu = NUMA_MAX_CPUS;
    }
    t->cpu_count = ncpu;
    for (int c = 0; c < ncpu; c++) {
        int n = f.node_of_cpu(c);
        if (n >= 0 && n < NUMA_MAX_NODES && (t->node_mask >> n & 1)) t->cpu_node[c] = (int16_t)n;
    }
    finish(t);
    fallback_reason[0] = '\0';
    return 0;
}

static const char *source_name(numa_source s);

static void detect_single(struct numa_topology *t) {
    reset(t, NUMA_SOURCE_SINGLE);
    t->node_mask = 1;
    t->mem_node_mask = 1;
    int n = possible_cpus();
    t->cpu_count = n > 0 ? n : NUMA_MAX_CPUS;
    /* Every CPU id, present or not, is node 0: nothing else exists. */
    for (int c = 0; c < NUMA_MAX_CPUS; c++)
        t->cpu_node[c] = 0;
    char buf[512];
    if (lull_read_text_file("/proc/meminfo", buf, sizeof buf) > 0) {
        t->mem_total[0] = lull_meminfo_bytes(buf, "MemTotal");
        t->mem_free[0] = lull_meminfo_bytes(buf, "MemFree");
    }
    finish(t);
    /* finish() counted every CPU id: keep the counts to the possible ones. */
    t->node_cpu_count[0] = (uint16_t)t->cpu_count;
    for (int c = t->cpu_count; c < NUMA_MAX_CPUS; c++)
        t->node_cpus[0][c / 64] &= ~(1ull << (c % 64));
}

static LULL_FORK_EXEC_DATA bool libnuma_always;

void numa_topology_always_libnuma(bool on) {
    libnuma_always = on;
}

/* Node 0 is the only node this process may allocate on (its cpuset's
 * mems, not the machine's possible nodes): one system call. Reading sysfs's
 * possible nodes walks a path, 9-11 us of every process start on a
 * Firecracker guest (a fork+exec of /bin/true, a child that execs at once,
 * pays it in full); and a machine whose firmware declares nodes it never
 * brings up has "0-1" there with memory on node 0 alone. */
LULL_FORK_EXEC_TEXT static bool only_node_0_allowed(void) {
    unsigned long mask[1024 / (8 * sizeof(unsigned long))] = {0};
    if (syscall(SYS_get_mempolicy, NULL, mask, (unsigned long)(8 * sizeof mask), NULL,
                (unsigned long)MPOL_F_MEMS_ALLOWED) != 0)
        return false; /* a seccomp filter, say: sysfs tells */
    if (mask[0] != 1) return false;
    for (size_t i = 1; i < sizeof mask / sizeof mask[0]; i++)
        if (mask[i]) return false;
    return true;
}

/* One node is all there is for lull: the process may allocate on node 0
 * alone, or the kernel can never bring up a second (sysfs says all there
 * is; a test's fake tree is read alone). */
LULL_FORK_EXEC_TEXT static bool one_possible_node(void) {
    if (strcmp(sysfs_root, "/sys") == 0 && only_node_0_allowed()) return true;
    char buf[64];
    /* the real tree without snprintf: this runs in every process's
     * constructor, where printf's code was 4 of its page faults */
    int r = strcmp(sysfs_root, "/sys") == 0
                ? lull_read_text_file("/sys/" NODE_DIR "/possible", buf, sizeof buf)
                : read_sysfs(NODE_DIR "/possible", 0, buf, sizeof buf);
    return r > 0 && strcmp(buf, "0\n") == 0;
}

LULL_FORK_EXEC_TEXT bool numa_topology_needs_libnuma(void) {
    return libnuma_always || !one_possible_node();
}

int numa_topology_init(void) {
    struct numa_topology *t = &topo_detected;
    bool injected = lull_numa_current == &topo_injected;
    int r = -1;
    if (lull_fault(LULL_FAULT_NUMA))
        set_reason("fault injected (numa): libnuma treated as absent", "");
    else if (!libnuma_always && one_possible_node()) {
        /* libnuma would tell us no more, and loading it (its constructor
         * reads a dozen files and probes the memory policy) was 250 us of
         * every process start, 40 % of a fork+exec of /bin/true */
        set_reason("one node", "libnuma not loaded");
        detect_single(t); /* sysfs has nothing more to say either */
        t->source = NUMA_SOURCE_SYSFS;
        r = 0;
    } else
        r = detect_libnuma(t);
    if (r != 0) {
        char why[sizeof fallback_reason];
        memcpy(why, fallback_reason, sizeof why);
        r = detect_sysfs(t);
        if (r != 0) {
            detect_single(t);
            const char *e = strerrordesc_np(-r);
            snprintf(fallback_reason, sizeof fallback_reason, "%.96s; %.64s/" NODE_DIR ": %.32s",
                     why, sysfs_root, e ? e : "unreadable");
        }
    }
    memcpy(saved_reason, fallback_reason, sizeof saved_reason);
    topo_saved = t;
    if (!injected)
        lull_numa_current = t;
    else
        memcpy(fallback_reason, "injected", sizeof "injected");
    lull_verbose("numa: %d node(s) from %s%s%s", t->node_count, source_name(t->source),
                 saved_reason[0] ? ", " : "", saved_reason);
    return lull_numa_current->node_count;
}

int numa_topology_inject(const struct numa_topology *src) {
    if (!src) {
        lull_numa_current = topo_saved;
        memcpy(fallback_reason, saved_reason, sizeof fallback_reason);
        return 0;
    }
    if (src->cpu_count < 0 || src->cpu_count > NUMA_MAX_CPUS) return -EINVAL;
    uint64_t named = 0;
    for (int c = 0; c < src->cpu_count; c++) {
        int n = src->cpu_node[c];
        if (n >= NUMA_MAX_NODES) return -EINVAL;
        if (n >= 0) named |= 1ull << n;
    }
    uint64_t with_mem = 0;
    for (int n = 0; n < NUMA_MAX_NODES; n++)
        if (src->mem_total[n]) with_mem |= 1ull << n;

    /* Build aside, then publish: the current topology may be topo_injected. */
    static struct numa_topology build;
    build = *src;
    struct numa_topology *t = &build;
    t->source = NUMA_SOURCE_INJECTED;
    for (int c = t->cpu_count; c < NUMA_MAX_CPUS; c++)
        t->cpu_node[c] = -1;
    if (!t->node_mask) t->node_mask = named | with_mem;
    if (!t->node_mask) t->node_mask = 1;
    if (!t->mem_node_mask) t->mem_node_mask = with_mem ? with_mem : t->node_mask;
    t->mem_node_mask &= t->node_mask;
    finish(t);
    topo_injected = build;
    lull_numa_current = &topo_injected;
    memcpy(fallback_reason, "injected", sizeof "injected");
    return 0;
}

/* Insertion sort of the memory nodes by (distance from node, id). */
int numa_nearest_nodes(int node, int *order, int max) {
    const struct numa_topology *t = lull_numa_current;
    if ((unsigned)node >= NUMA_MAX_NODES || !(t->node_mask >> node & 1)) return -1;
    int count = 0;
    int cand[NUMA_MAX_NODES];
    uint64_t mem = t->mem_node_mask & t->node_mask;
    for (int m = 0; m < NUMA_MAX_NODES; m++) {
        if (!(mem >> m & 1)) continue;
        int i = count++;
        /* Self first, then by distance, then by id (m ascends). */
        while (i > 0) {
            int p = cand[i - 1];
            bool before = m == node || (p != node && t->distance[node][m] < t->distance[node][p]);
            if (!before) break;
            cand[i] = p;
            i--;
        }
        cand[i] = m;
    }
    if (count > max) count = max < 0 ? 0 : max;
    for (int i = 0; i < count; i++)
        order[i] = cand[i];
    return count;
}

static const char *source_name(numa_source s) {
    switch (s) {
    case NUMA_SOURCE_SYSFS:
        return "sysfs";
    case NUMA_SOURCE_LIBNUMA:
        return "libnuma";
    case NUMA_SOURCE_INJECTED:
        return "injected";
    case NUMA_SOURCE_SINGLE:
        break;
    }
    return "single";
}

const char *numa_topology_source(void) {
    return source_name(lull_numa_current->source);
}

const char *numa_topology_fallback_reason(void) {
    return fallback_reason;
}

int numa_topology_set_sysfs_root(const char *root) {
    if (!root) root = "/sys";
    size_t len = strlen(root);
    if (len == 0 || len >= sizeof sysfs_root) return -EINVAL;
    memcpy(sysfs_root, root, len + 1);
    return 0;
}

static int fmt_size(char *buf, size_t len, uint64_t bytes) {
    if (bytes >= (1ull << 30) && bytes % (1ull << 30) == 0)
        return snprintf(buf, len, "%lluG", (unsigned long long)(bytes >> 30));
    return snprintf(buf, len, "%lluM", (unsigned long long)(bytes >> 20));
}

int numa_topology_format(char *buf, int len) {
    const struct numa_topology *t = lull_numa_current;
    if (len <= 0) return 0;
    int pos = snprintf(buf, (size_t)len, "nodes=%d source=%s cpus=%d", t->node_count,
                       numa_topology_source(), t->cpu_count);
    for (int n = 0; n < NUMA_MAX_NODES && pos < len; n++) {
        if (!(t->node_mask >> n & 1)) continue;
        char total[24], free_[24];
        fmt_size(total, sizeof total, t->mem_total[n]);
        fmt_size(free_, sizeof free_, t->mem_free[n]);
        pos +=
            snprintf(buf + pos, (size_t)(len - pos), " | node%d: cpus=%d mem=%s free=%s dist=", n,
                     t->node_cpu_count[n], total, free_);
        for (int m = 0, first = 1; m < NUMA_MAX_NODES && pos < len; m++) {
            if (!(t->node_mask >> m & 1)) continue;
            pos += snprintf(buf + pos, (size_t)(len - pos), "%s%d", first ? "" : ",",
                            t->distance[n][m]);
            first = 0;
        }
    }
    if (pos >= len) pos = len - 1;
    return pos;
}
