/* The calling thread's NUMA node; see home_node.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "numa/home_node.h"
#include "base/linux_compat.h"
#include "base/message.h"

#include <errno.h>
#include <sched.h>
#include <sys/auxv.h>

#if defined(__GLIBC__) && defined(__has_include)
#if __has_include(<sys/rseq.h>)
#include <sys/rseq.h> /* __rseq_offset, __rseq_size (glibc 2.35+) */
#define LULL_HAVE_GLIBC_RSEQ 1
#endif
#endif

/* End of the node_id field: a kernel whose AT_RSEQ_FEATURE_SIZE covers it
 * keeps node_id up to date (6.3+). */
#define RSEQ_NODE_ID_END (LULL_RSEQ_NODE_ID_OFFSET + 4)

int lull_home_mode = LULL_HOME_SINGLE;
ptrdiff_t lull_home_rseq_offset;
__thread int lull_home_override __attribute__((tls_model("initial-exec")));

/* Node of the CPU getcpu() reports: through the table when the topology is
 * injected (the fake node of that CPU), else the kernel's own answer. */
int lull_current_node_slow(void) {
    unsigned cpu = 0, node = 0;
    if (getcpu(&cpu, &node) != 0) return 0;
    const struct numa_topology *t = lull_numa_current;
    if (t->source == NUMA_SOURCE_INJECTED || node >= NUMA_MAX_NODES) {
        int n = numa_cpu_node((int)cpu);
        return n >= 0 ? n : 0;
    }
    return (int)node;
}

int home_node_current(void) {
    return lull_current_node();
}

int lull_current_cpu(void) {
    int mode = __atomic_load_n(&lull_home_mode, __ATOMIC_RELAXED);
    if (mode == LULL_HOME_RSEQ_NODE || mode == LULL_HOME_RSEQ_CPU) {
        const char *rs = lull_thread_pointer() + lull_home_rseq_offset;
        int32_t cpu = (int32_t)__atomic_load_n((const uint32_t *)(rs + LULL_RSEQ_CPU_ID_OFFSET),
                                               __ATOMIC_RELAXED);
        if (cpu >= 0) return cpu;
    }
    unsigned cpu = 0;
    if (getcpu(&cpu, NULL) != 0) return -1;
    return (int)cpu;
}

#ifdef LULL_HAVE_GLIBC_RSEQ
/* Is the rseq area glibc registered for this thread live, and does its
 * node_id agree with getcpu()? */
static int rseq_probe(void) {
    if (__rseq_size == 0) return 0; /* glibc did not register (tunable, old kernel) */
    const char *rs = lull_thread_pointer() + __rseq_offset;
    int32_t cpu = (int32_t)__atomic_load_n((const uint32_t *)(rs + LULL_RSEQ_CPU_ID_OFFSET),
                                           __ATOMIC_RELAXED);
    if (cpu < 0) return 0;
    /* The fields the kernel keeps current. glibc 2.35/2.36 published 32
     * and later ones (and Debian 12's updates) 20 for the same 32-byte
     * area, without asking the kernel: for those two values the kernel's
     * AT_RSEQ_FEATURE_SIZE (6.3+; absent = the original 20) decides, as in
     * librseq. The kernel accepts no area under 32 bytes, so node_id (bytes
     * 20..23) is always inside the registered area. */
    unsigned long active = __rseq_size;
    if (active == 20 || active == 32) {
        unsigned long feature = getauxval(AT_RSEQ_FEATURE_SIZE);
        if (feature < 20) feature = 20;
        active = feature < 32 ? feature : 32;
    }
    if (active < RSEQ_NODE_ID_END) return LULL_HOME_RSEQ_CPU;
    /* Cross-check node_id once (a migration between the two reads can
     * differ: retry a few times before distrusting it). */
    for (int i = 0; i < 8; i++) {
        unsigned c = 0, n = 0;
        if (getcpu(&c, &n) != 0) return LULL_HOME_RSEQ_NODE;
        uint32_t rn =
            __atomic_load_n((const uint32_t *)(rs + LULL_RSEQ_NODE_ID_OFFSET), __ATOMIC_RELAXED);
        if (rn == n) return LULL_HOME_RSEQ_NODE;
    }
    lull_verbose("numa: rseq node_id disagrees with getcpu(); using cpu_id");
    return LULL_HOME_RSEQ_CPU;
}
#endif

int home_node_init(void) {
    const struct numa_topology *t = lull_numa_current;
    int mode = LULL_HOME_SINGLE;
    if (t->node_count > 1) {
        mode = LULL_HOME_GETCPU;
#ifdef LULL_HAVE_GLIBC_RSEQ
        int r = rseq_probe();
        if (r) {
            lull_home_rseq_offset = __rseq_offset;
            mode = r;
            /* The kernel's node_id knows nothing of a fake topology. */
            if (mode == LULL_HOME_RSEQ_NODE && t->source == NUMA_SOURCE_INJECTED)
                mode = LULL_HOME_RSEQ_CPU;
        }
#endif
    }
    __atomic_store_n(&lull_home_mode, mode, __ATOMIC_RELAXED);
    lull_verbose("numa: home node from %s", home_node_source());
    return mode;
}

int home_node_set_mode(lull_home_mode_t mode) {
    if (mode == LULL_HOME_RSEQ_NODE || mode == LULL_HOME_RSEQ_CPU) {
#ifdef LULL_HAVE_GLIBC_RSEQ
        int r = rseq_probe();
        if (!r || (mode == LULL_HOME_RSEQ_NODE && r != LULL_HOME_RSEQ_NODE)) return -EINVAL;
        lull_home_rseq_offset = __rseq_offset;
#else
        return -EINVAL;
#endif
    } else if (mode != LULL_HOME_GETCPU && mode != LULL_HOME_SINGLE) {
        return -EINVAL;
    }
    __atomic_store_n(&lull_home_mode, (int)mode, __ATOMIC_RELAXED);
    return 0;
}

const char *home_node_source(void) {
    switch (__atomic_load_n(&lull_home_mode, __ATOMIC_RELAXED)) {
    case LULL_HOME_RSEQ_NODE:
        return "rseq";
    case LULL_HOME_RSEQ_CPU:
        return "rseq-cpu";
    case LULL_HOME_GETCPU:
        return "getcpu";
    default:
        return "single-node";
    }
}

int home_node_set_thread(int node) {
    if (node == -1) {
        lull_home_override = 0;
        return 0;
    }
    if (!numa_node_present(node)) return -EINVAL;
    lull_home_override = node + 1;
    return 0;
}
