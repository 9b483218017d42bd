/* The calling thread's NUMA node, without a system call on the fast path.
 *
 * Mechanisms, best first (home_node_source() names the one in force):
 *   "rseq"        the node_id field of the rseq area glibc registered for
 *                 the thread (kernel 6.3+): two loads, ~0.3 ns.
 *   "rseq-cpu"    the cpu_id field of that rseq area (kernels before 6.3)
 *                 mapped through the topology's cpu->node table.
 *   "getcpu"      getcpu() through the vDSO (~3 ns), CPU mapped through the
 *                 table; used when glibc registered no rseq area.
 *   "single-node" one node: always 0. Also the mode before home_node_init()
 *                 runs, so lull_current_node() is safe at any time; with
 *                 the NUMA policy "off" the caller simply never calls init.
 * A thread-local override (home_node_set_thread(), for
 * lull_thread_set_node()) wins over all of them.
 *
 * The node is a hint that can be stale by the time it is used (the thread
 * may migrate right after): a heap keeps the node it was created on and
 * checks lull_thread_migrated() on its slow paths. */
#ifndef LULL_NUMA_HOME_NODE_H
#define LULL_NUMA_HOME_NODE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "numa/topology.h"

typedef enum {
    LULL_HOME_SINGLE = 0,
    LULL_HOME_RSEQ_NODE = 1,
    LULL_HOME_RSEQ_CPU = 2,
    LULL_HOME_GETCPU = 3,
} lull_home_mode_t;

/* Offsets in struct rseq (include/uapi/linux/rseq.h): cpu_id at 4, node_id
 * at 20 (6.3+; the 6.1 headers do not name it). */
#define LULL_RSEQ_CPU_ID_OFFSET 4
#define LULL_RSEQ_NODE_ID_OFFSET 20

extern int lull_home_mode __attribute__((visibility("hidden"))); /* lull_home_mode_t */
extern ptrdiff_t lull_home_rseq_offset
    __attribute__((visibility("hidden"))); /* glibc's __rseq_offset */
/* Thread-local override: node + 1, 0 when none. */
extern __thread int lull_home_override __attribute__((visibility("hidden")))
__attribute__((tls_model("initial-exec")));

/* The slow path: getcpu(), or a thread whose rseq area is not registered. */
int lull_current_node_slow(void);

static inline char *lull_thread_pointer(void) {
#if defined(__x86_64__)
    char *tp;
    __asm__("mov %%fs:0, %0" : "=r"(tp));
    return tp;
#else
    return (char *)__builtin_thread_pointer();
#endif
}

/* The calling thread's node (>= 0). No system call, no atomic RMW. */
static inline int lull_current_node(void) {
    int o = lull_home_override;
    if (__builtin_expect(o != 0, 0)) return o - 1;
    int mode = __atomic_load_n(&lull_home_mode, __ATOMIC_RELAXED);
    if (mode == LULL_HOME_SINGLE) return 0;
    if (mode <= LULL_HOME_RSEQ_CPU) {
        const char *rs = lull_thread_pointer() + lull_home_rseq_offset;
        int32_t cpu = (int32_t)__atomic_load_n((const uint32_t *)(rs + LULL_RSEQ_CPU_ID_OFFSET),
                                               __ATOMIC_RELAXED);
        if (__builtin_expect(cpu >= 0, 1)) { /* < 0: this thread has no rseq area */
            if (mode == LULL_HOME_RSEQ_NODE)
                return (int)__atomic_load_n((const uint32_t *)(rs + LULL_RSEQ_NODE_ID_OFFSET),
                                            __ATOMIC_RELAXED);
            int n = numa_cpu_node(cpu);
            if (__builtin_expect(n >= 0, 1)) return n;
        }
    }
    return lull_current_node_slow();
}

/* lull_current_node() as a function, for a function pointer
 * (lull_set_home_node_fn); calling the inline directly is cheaper. */
int home_node_current(void);

/* True when the thread now runs on another node than heap_node (the node
 * its heap was created for). Cheap enough for every slow path. */
static inline bool lull_thread_migrated(int heap_node) {
    return lull_current_node() != heap_node;
}

/* Choose the mechanism for the topology in force (call after
 * numa_topology_init(), and again after numa_topology_inject()). With an
 * injected topology the node always comes from the CPU id through the
 * injected cpu->node table (rseq cpu_id or getcpu), so a test that pins a
 * thread to CPU c sees the fake node of c. Returns the mode. No allocation;
 * at most one getauxval and one getcpu. */
int home_node_init(void);

/* Force a mechanism (tests compare them): -EINVAL when it cannot work here
 * (an rseq mode without a registered rseq area, node_id on a kernel before
 * 6.3). Returns 0. home_node_init() chooses again. */
int home_node_set_mode(lull_home_mode_t mode);

/* "rseq", "rseq-cpu", "getcpu" or "single-node". */
const char *home_node_source(void);

/* Set the calling thread's node explicitly (lull_thread_set_node()); -1
 * clears the override. Returns 0, or -EINVAL for a node that is not present
 * in the topology. */
int home_node_set_thread(int node);
/* The calling thread's override, -1 when none. */
static inline int home_node_thread_override(void) {
    return lull_home_override - 1;
}

/* The calling thread's CPU (rseq cpu_id, else getcpu), -1 if unknown. */
int lull_current_cpu(void);

#endif
