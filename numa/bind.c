/* mbind of whole segments and page placement queries; see bind.h. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "numa/bind.h"
#include "base/linux_compat.h"
#include "base/message.h"

#include <errno.h>
#include <linux/mempolicy.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_set_mempolicy_home_node
#define __NR_set_mempolicy_home_node 450
#endif

/* One unsigned long of node mask; maxnode counts one more bit than the mask
 * holds (the kernel drops the last bit: get_nodes() does --maxnode). */
#define MASK_MAXNODE (NUMA_MAX_NODES + 1)

static long sys_mbind(void *addr, size_t len, int mode, const unsigned long *mask,
                      unsigned long maxnode) {
    long r = syscall(__NR_mbind, addr, len, mode, mask, maxnode, 0u);
    return r < 0 ? -errno : 0;
}

static _Atomic int home_node_call = 1; /* set_mempolicy_home_node still worth trying */

static int bind_segment(void *addr, size_t len, int node, lull_numa_policy policy,
                        uint64_t nodemask) {
    const struct numa_topology *t = numa_topology();
    if (policy == LULL_NUMA_OFF) return 1;
    if (((uintptr_t)addr & 4095) || len == 0) return -EINVAL;
    if (t->node_count <= 1) return 1;

    uint64_t all = t->mem_node_mask & t->node_mask;
    unsigned long mask;
    long r;
    switch (policy) {
    case LULL_NUMA_LOCAL:
        if (node < 0) return (int)sys_mbind(addr, len, MPOL_LOCAL, NULL, 0);
        if (node >= NUMA_MAX_NODES) return -EINVAL;
        mask = 1ul << node;
        return (int)sys_mbind(addr, len, MPOL_PREFERRED, &mask, MASK_MAXNODE);
    case LULL_NUMA_INTERLEAVE:
        mask = (unsigned long)(nodemask ? nodemask : all);
        if (!mask) return -EINVAL;
        return (int)sys_mbind(addr, len, MPOL_INTERLEAVE, &mask, MASK_MAXNODE);
    case LULL_NUMA_BIND:
        mask = (unsigned long)(nodemask ? nodemask : all);
        if (!mask) return -EINVAL;
        r = sys_mbind(addr, len, MPOL_BIND, &mask, MASK_MAXNODE);
        if (r < 0) return (int)r;
        if (node >= 0 && node < NUMA_MAX_NODES && (mask >> node & 1) && (mask & (mask - 1)) &&
            atomic_load_explicit(&home_node_call, memory_order_relaxed)) {
            if (syscall(__NR_set_mempolicy_home_node, addr, len, (unsigned long)node, 0ul) != 0) {
                if (errno == ENOSYS) {
                    atomic_store_explicit(&home_node_call, 0, memory_order_relaxed);
                    lull_verbose("numa: no set_mempolicy_home_node (kernel < 5.17): bound "
                                 "segments fill from the faulting CPU's node");
                }
                /* Best effort: the binding itself is in place. */
            }
        }
        return 0;
    case LULL_NUMA_OFF:
        break;
    }
    return 1;
}

static _Atomic uint64_t n_bound, n_skipped, n_failed;
static _Atomic int last_error;

int numa_bind_segment(void *addr, size_t len, int node, lull_numa_policy policy,
                      uint64_t nodemask) {
    int r = bind_segment(addr, len, node, policy, nodemask);
    if (r == 0)
        atomic_fetch_add_explicit(&n_bound, 1, memory_order_relaxed);
    else if (r > 0)
        atomic_fetch_add_explicit(&n_skipped, 1, memory_order_relaxed);
    else {
        atomic_fetch_add_explicit(&n_failed, 1, memory_order_relaxed);
        atomic_store_explicit(&last_error, r, memory_order_relaxed);
    }
    return r;
}

void numa_segment_prepare(void *segment, size_t len, int node) {
    static _Atomic int reported;
    /* Inside a malloc that goes on to succeed: a refused mbind or
     * set_mempolicy_home_node (best effort both), or the message, must not
     * leave its errno to the caller (test_numa_bind_errno) */
    int saved = errno;
    int r = numa_bind_segment(segment, len, node, lull_config.numa, lull_config.numa_nodes);
    if (r < 0 && !atomic_exchange_explicit(&reported, 1, memory_order_relaxed)) {
        const char *e = strerrordesc_np(-r);
        lull_message("numa: cannot set the memory policy of node %d's segments (%s); their "
                     "pages go where the kernel puts them",
                     node, e ? e : "error");
    }
    errno = saved;
}

void numa_bind_stats(struct numa_bind_stats *out) {
    out->bound = atomic_load_explicit(&n_bound, memory_order_relaxed);
    out->skipped = atomic_load_explicit(&n_skipped, memory_order_relaxed);
    out->failed = atomic_load_explicit(&n_failed, memory_order_relaxed);
    out->last_error = atomic_load_explicit(&last_error, memory_order_relaxed);
}

int numa_page_node(const void *addr) {
    void *page = (void *)((uintptr_t)addr & ~(uintptr_t)4095);
    int status = -1;
    long r = syscall(__NR_move_pages, 0, 1ul, &page, NULL, &status, 0);
    if (r < 0) return -errno;
    return status; /* node, or -errno for this page (-ENOENT, -EFAULT) */
}

long numa_pages_nodes(const void *addr, size_t len, size_t page_size,
                      uint64_t counts[NUMA_MAX_NODES], uint64_t *absent) {
    enum { BATCH = 256 };
    void *pages[BATCH];
    int status[BATCH];
    if (!page_size) page_size = 4096;
    memset(counts, 0, sizeof(uint64_t) * NUMA_MAX_NODES);
    if (absent) *absent = 0;
    uintptr_t p = (uintptr_t)addr & ~(uintptr_t)(page_size - 1);
    uintptr_t end = (uintptr_t)addr + len;
    long total = 0;
    while (p < end) {
        unsigned long n = 0;
        for (; n < BATCH && p < end; n++, p += page_size)
            pages[n] = (void *)p;
        long r = syscall(__NR_move_pages, 0, n, pages, NULL, status, 0);
        if (r < 0) return -errno;
        for (unsigned long i = 0; i < n; i++) {
            if (status[i] >= 0 && status[i] < NUMA_MAX_NODES)
                counts[status[i]]++;
            else if (absent)
                (*absent)++;
        }
        total += (long)n;
    }
    return total;
}

int numa_segment_policy(const void *addr, int *mode, uint64_t *mask) {
    int m = 0;
    unsigned long nodes = 0;
    long r = syscall(__NR_get_mempolicy, &m, &nodes, (unsigned long)MASK_MAXNODE, addr,
                     (unsigned long)MPOL_F_ADDR);
    if (r < 0) return -errno;
    if (mode) *mode = m;
    if (mask) *mask = nodes;
    return 0;
}
