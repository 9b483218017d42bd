/* Guest checks of the whole allocator on two NUMA nodes: the guest program
 * is linked with liblull.a (build.sh --lib), so malloc and free are lull's.
 *
 *   lull_local          threads on each node's CPU get small, large and huge
 *                       blocks whose pages are on that node (move_pages)
 *   lull_remote_free    a node-1 thread frees a node-0 thread's blocks: no
 *                       memory moves (node 0 reuses its own pages, node 1
 *                       takes none of node 0's segments)
 *   lull_interleave     LULL_CONF=numa=interleave spreads a thread's pages
 *   lull_bind           LULL_CONF=numa=bind,numa_nodes=1 puts a node-0
 *                       thread's pages on node 1
 *   lull_set_node       lull_thread_set_node(1) on a node-0 thread
 *   lull_stats_nodes    lull_stats(): two nodes, the accounting identity per
 *                       node, each node's live bytes
 *
 * Every check runs as a sub-check (guest.h, guest_sub.c), in a fresh
 * process of this program with LULL_CONF set for the check. A fresh process
 * is needed twice over: lull reads LULL_CONF and the NUMA topology once, in
 * its constructor, and the /init process itself started lull before it had
 * mounted /sys, so it runs as one node. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#include "guest.h"

#include "lull.h"
#include "lull/counters.h"
#include "numa/topology.h"

#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define KIB ((size_t)1024)
#define MIB (1024 * KIB)
#define PAGE ((uintptr_t)4096)
/* lull's size limits (base/types.h): blocks up to SMALL_MAX come from size
 * classes, up to LARGE_MAX from one-block spans, larger ones are huge
 * mappings; segments are 32 MiB, aligned. */
#define SMALL_MAX (512 * KIB)
#define LARGE_MAX (16 * MIB)
#define SEGMENT ((uintptr_t)32 * MIB)

enum { K_SMALL, K_LARGE, K_HUGE, K_COUNT };
static const char *const kind_name[K_COUNT] = {"small", "large", "huge"};

static int kind_of(size_t size) {
    return size <= SMALL_MAX ? K_SMALL : size <= LARGE_MAX ? K_LARGE : K_HUGE;
}

#define REQUIRE(cond, ...)                                                                         \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            guest_sub_detail(__VA_ARGS__);                                                         \
            return GUEST_FAIL;                                                                     \
        }                                                                                          \
    } while (0)

/* ---- sets of blocks ---- */

#define MAX_BLOCKS 4096

struct blockset {
    int n;
    size_t bytes;
    void *p[MAX_BLOCKS];
    size_t size[MAX_BLOCKS];
};

static struct blockset *set_new(void) {
    /* Not malloc: the measuring structures stay out of lull's heaps. */
    return guest_map(sizeof(struct blockset));
}

static void set_delete(struct blockset *s) {
    if (s) munmap(s, sizeof *s);
}

/* The mix of a thread: 3000 small blocks of 16 B - 7 KiB, 24 small blocks
 * of 24-400 KiB (multi-slice spans), three large blocks (700 KiB - 5 MiB)
 * and one huge block of 17 MiB; about 33 MiB, every byte written. Returns
 * false when malloc fails. */
static bool set_alloc_mix(struct blockset *s, unsigned char fill) {
    static const size_t small[] = {16, 40, 96, 200, 520, 1100, 3000, 7000};
    static const size_t mid[] = {24 * KIB, 72 * KIB, 150 * KIB, 400 * KIB};
    static const size_t large[] = {700 * KIB, 2 * MIB, 5 * MIB};
    size_t sizes[MAX_BLOCKS];
    int n = 0;
    for (int i = 0; i < 3000; i++)
        sizes[n++] = small[i % 8];
    for (int i = 0; i < 24; i++)
        sizes[n++] = mid[i % 4];
    for (int i = 0; i < 3; i++)
        sizes[n++] = large[i];
    sizes[n++] = 17 * MIB;
    s->n = 0;
    s->bytes = 0;
    for (int i = 0; i < n; i++) {
        void *p = malloc(sizes[i]);
        if (!p) return false;
        memset(p, fill, sizes[i]);
        s->p[s->n] = p;
        s->size[s->n++] = sizes[i];
        s->bytes += sizes[i];
    }
    return true;
}

static void set_free(struct blockset *s) {
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
    s->n = 0;
    s->bytes = 0;
}

/* ---- where the pages are ---- */

struct pagecount {
    long pages; /* distinct pages */
    uint64_t on[NUMA_MAX_NODES];
    uint64_t absent; /* not present (never touched, or purged) */
};

static int cmp_uptr(const void *a, const void *b) {
    uintptr_t x = *(const uintptr_t *)a, y = *(const uintptr_t *)b;
    return x < y ? -1 : x > y;
}

/* Count the distinct pages of the blocks of s whose kind is in kinds (a
 * bit mask of 1 << K_*), per node, with move_pages(). 0 or -errno. */
static int set_pages(const struct blockset *s, unsigned kinds, struct pagecount *pc) {
    memset(pc, 0, sizeof *pc);
    size_t cap = 0;
    for (int i = 0; i < s->n; i++)
        if (kinds >> kind_of(s->size[i]) & 1) cap += s->size[i] / PAGE + 2;
    if (cap == 0) return 0;
    size_t bytes = (cap * sizeof(uintptr_t) + PAGE - 1) & ~(PAGE - 1);
    uintptr_t *pages = guest_map(bytes);
    if (!pages) return -ENOMEM;
    size_t n = 0;
    for (int i = 0; i < s->n; i++) {
        if (!(kinds >> kind_of(s->size[i]) & 1)) continue;
        uintptr_t a = (uintptr_t)s->p[i] & ~(PAGE - 1);
        uintptr_t end = (uintptr_t)s->p[i] + s->size[i];
        for (; a < end; a += PAGE)
            pages[n++] = a;
    }
    qsort(pages, n, sizeof pages[0], cmp_uptr);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || pages[u - 1] != pages[i]) pages[u++] = pages[i];
    int rc = 0;
    enum { BATCH = 512 };
    int status[BATCH];
    for (size_t i = 0; i < u && rc == 0; i += BATCH) {
        unsigned long k = u - i < BATCH ? u - i : BATCH;
        if (syscall(__NR_move_pages, 0, k, (void **)(pages + i), NULL, status, 0) < 0) {
            rc = -errno;
            break;
        }
        for (unsigned long j = 0; j < k; j++) {
            if (status[j] >= 0 && status[j] < NUMA_MAX_NODES)
                pc->on[status[j]]++;
            else
                pc->absent++;
        }
    }
    pc->pages = (long)u;
    munmap(pages, bytes);
    return rc;
}

static double pct(uint64_t part, long whole) {
    return whole > 0 ? 100.0 * (double)part / (double)whole : 0;
}

/* Pages of each kind and of all; "small 100.00% of 1234, ..." on node into
 * text. Returns the lowest share on node over the kinds that have pages
 * (and all), or -1 after guest_sub_detail() when move_pages failed or a page is
 * absent. */
static double set_share(const struct blockset *s, int node, char *text, size_t len,
                        struct pagecount *all) {
    double low = 100;
    text[0] = '\0';
    for (int k = 0; k <= K_COUNT; k++) {
        struct pagecount pc;
        unsigned kinds = k == K_COUNT ? (1u << K_COUNT) - 1 : 1u << k;
        int rc = set_pages(s, kinds, &pc);
        if (rc < 0) {
            guest_sub_detail("move_pages: %s", strerror(-rc));
            return -1;
        }
        if (pc.absent) {
            guest_sub_detail("%llu of %ld touched %s pages not present",
                             (unsigned long long)pc.absent, pc.pages,
                             k == K_COUNT ? "" : kind_name[k]);
            return -1;
        }
        if (pc.pages == 0) continue;
        double share = pct(pc.on[node], pc.pages);
        if (share < low) low = share;
        size_t l = strlen(text);
        snprintf(text + l, len - l, "%s%s %.2f%% of %ld", l ? ", " : "",
                 k == K_COUNT ? "all" : kind_name[k], share, pc.pages);
        if (k == K_COUNT && all) *all = pc;
    }
    return low;
}

/* ---- the machine ---- */

static int node_cpu(int node) {
    const struct numa_topology *t = numa_topology();
    for (int c = 0; c < t->cpu_count; c++)
        if (t->cpu_node[c] == node) return c;
    return -1;
}

/* malloc is lull's, and lull started its NUMA layer (in its constructor)
 * with two nodes that have a CPU each. */
static bool two_nodes(void) {
    void *probe = calloc(1, 64); /* calloc: gcc warns of an uninitialised const argument */
    bool ours = lull_owns(probe);
    free(probe);
    if (!ours) {
        guest_sub_detail("malloc is not lull's (liblull.a built without LULL_OVERRIDE?)");
        return false;
    }
    if (numa_node_count() < 2) {
        guest_sub_detail("lull sees %d node(s) (topology from %s: %s)", numa_node_count(),
                         numa_topology_source(), numa_topology_fallback_reason());
        return false;
    }
    if (node_cpu(0) < 0 || node_cpu(1) < 0) {
        guest_sub_detail("no CPU on node 0 or 1");
        return false;
    }
    return true;
}

/* ---- (a) local placement ---- */

struct local_arg {
    int node;
    double low;
    char text[512];
};

static int local_fn(void *arg) {
    struct local_arg *a = arg;
    struct blockset *s = set_new();
    if (!s) return GUEST_FAIL;
    int r = GUEST_FAIL;
    if (!set_alloc_mix(s, 0x5a)) {
        guest_sub_detail("malloc failed on node %d", a->node);
    } else {
        a->low = set_share(s, a->node, a->text, sizeof a->text, NULL);
        if (a->low >= 0) r = GUEST_PASS;
    }
    set_free(s);
    set_delete(s);
    return r;
}

static int sub_local(void) {
    double low = 100;
    for (int node = 0; node < 2; node++) {
        struct local_arg a = {.node = node};
        if (guest_on_cpu(node_cpu(node), local_fn, &a) != GUEST_PASS) return GUEST_FAIL;
        guest_sub_info("thread on node %d, pages on node %d: %s", node, node, a.text);
        REQUIRE(a.low >= 99.0, "node %d thread: only %.2f%% on its node (%s)", node, a.low, a.text);
        if (a.low < low) low = a.low;
    }
    guest_sub_detail("small, large and huge blocks of a thread on each node: >= %.2f%% of their "
                     "pages on that node",
                     low);
    return GUEST_PASS;
}

/* ---- (b) remote frees move no memory ---- */

struct remote {
    pthread_barrier_t step;
    struct blockset *a1, *a2, *b1;
    int fail; /* set by either thread */
    double a1_share, b1_share, a2_share, a1_after_free;
    uint64_t a1_absent_after_free;
    char a1_text[512], b1_text[512], a2_text[512];
};

static void remote_fail(struct remote *r) {
    __atomic_store_n(&r->fail, 1, __ATOMIC_RELAXED);
}

static int remote_a(void *arg) { /* node 0 */
    struct remote *r = arg;
    if (!set_alloc_mix(r->a1, 0xa1)) {
        guest_sub_detail("node 0: malloc failed");
        remote_fail(r);
    } else {
        r->a1_share = set_share(r->a1, 0, r->a1_text, sizeof r->a1_text, NULL);
        if (r->a1_share < 0) remote_fail(r);
    }
    pthread_barrier_wait(&r->step); /* 1: a1 ready */
    pthread_barrier_wait(&r->step); /* 2: b freed a1 and allocated b1 */
    if (!__atomic_load_n(&r->fail, __ATOMIC_RELAXED)) {
        if (!set_alloc_mix(r->a2, 0xa2)) {
            guest_sub_detail("node 0: malloc failed after the remote frees");
            remote_fail(r);
        } else {
            r->a2_share = set_share(r->a2, 0, r->a2_text, sizeof r->a2_text, NULL);
            if (r->a2_share < 0) remote_fail(r);
        }
    }
    pthread_barrier_wait(&r->step); /* 3: done */
    return GUEST_PASS;
}

static int remote_b(void *arg) { /* node 1 */
    struct remote *r = arg;
    pthread_barrier_wait(&r->step); /* 1 */
    if (!__atomic_load_n(&r->fail, __ATOMIC_RELAXED)) {
        /* a1 keeps the addresses: the check looks at the freed pages later */
        for (int i = 0; i < r->a1->n; i++)
            free(r->a1->p[i]);
        if (!set_alloc_mix(r->b1, 0xb1)) {
            guest_sub_detail("node 1: malloc failed");
            remote_fail(r);
        } else {
            r->b1_share = set_share(r->b1, 1, r->b1_text, sizeof r->b1_text, NULL);
            if (r->b1_share < 0) remote_fail(r);
        }
    }
    pthread_barrier_wait(&r->step); /* 2 */
    pthread_barrier_wait(&r->step); /* 3 */
    return GUEST_PASS;
}

struct runner {
    int cpu;
    int (*fn)(void *);
    struct remote *r;
    pthread_t t;
};

/* Pinned: on failure the thread still takes part in every step (the other
 * one waits for it at the barrier), and the check fails. */
static void *runner_main(void *p) {
    struct runner *ru = p;
    if (!guest_pin_cpu(ru->cpu)) {
        guest_sub_detail("cannot pin a thread to cpu %d", ru->cpu);
        remote_fail(ru->r);
    }
    ru->fn(ru->r);
    return NULL;
}

/* Does block i of s lie in a segment (32 MiB, aligned) that holds a small
 * or large block of other? */
static bool in_segments_of(const struct blockset *other, uintptr_t p) {
    for (int j = 0; j < other->n; j++)
        if (kind_of(other->size[j]) != K_HUGE &&
            ((uintptr_t)other->p[j] & ~(SEGMENT - 1)) == (p & ~(SEGMENT - 1)))
            return true;
    return false;
}

static int sub_remote_free(void) {
    struct remote *r = guest_map(sizeof *r);
    REQUIRE(r, "mmap failed");
    r->a1 = set_new();
    r->a2 = set_new();
    r->b1 = set_new();
    REQUIRE(r->a1 && r->a2 && r->b1, "mmap failed");
    pthread_barrier_init(&r->step, NULL, 2);
    struct runner ra = {node_cpu(0), remote_a, r, 0}, rb = {node_cpu(1), remote_b, r, 0};
    REQUIRE(pthread_create(&ra.t, NULL, runner_main, &ra) == 0, "pthread_create");
    REQUIRE(pthread_create(&rb.t, NULL, runner_main, &rb) == 0, "pthread_create");
    pthread_join(ra.t, NULL);
    pthread_join(rb.t, NULL);
    if (r->fail) return GUEST_FAIL;

    guest_sub_info("node-0 thread, first blocks: %s", r->a1_text);
    guest_sub_info("node-1 thread freed them all and allocated its own: %s", r->b1_text);
    guest_sub_info("node-0 thread allocated again: %s", r->a2_text);
    REQUIRE(r->a1_share >= 99.0, "node 0's first blocks: %.2f%% on node 0 (%s)", r->a1_share,
            r->a1_text);
    REQUIRE(r->b1_share >= 99.0, "node 1's blocks: %.2f%% on node 1 (%s)", r->b1_share, r->b1_text);
    REQUIRE(r->a2_share >= 99.0,
            "node 0's blocks after node 1 freed its first ones: %.2f%% on node 0 (%s)", r->a2_share,
            r->a2_text);

    /* The freed first blocks' pages (small and large; huge ones are
     * unmapped) that are still resident stayed on node 0. */
    struct pagecount pc;
    int rc = set_pages(r->a1, 1u << K_SMALL | 1u << K_LARGE, &pc);
    REQUIRE(rc == 0, "move_pages: %s", strerror(-rc));
    long present = pc.pages - (long)pc.absent;
    double stayed = pct(pc.on[0], present);
    REQUIRE(present == 0 || stayed >= 99.0,
            "freed pages of node 0's blocks: %.2f%% of %ld resident ones on node 0", stayed,
            present);

    /* Node 1 took none of node 0's segments; node 0 reused its own. */
    int b_in_a = 0, a2_in_a1 = 0, a2_small_large = 0;
    for (int i = 0; i < r->b1->n; i++)
        if (kind_of(r->b1->size[i]) != K_HUGE && in_segments_of(r->a1, (uintptr_t)r->b1->p[i]))
            b_in_a++;
    for (int i = 0; i < r->a2->n; i++) {
        if (kind_of(r->a2->size[i]) == K_HUGE) continue;
        a2_small_large++;
        if (in_segments_of(r->a1, (uintptr_t)r->a2->p[i])) a2_in_a1++;
    }
    guest_sub_info(
        "freed pages of node 0's first blocks: %ld resident, %.2f%% on node 0; node 1's "
        "blocks in node 0's segments: %d; node 0's new blocks in its old segments: %d of "
        "%d",
        present, stayed, b_in_a, a2_in_a1, a2_small_large);
    REQUIRE(b_in_a == 0, "%d of node 1's blocks are in node 0's segments", b_in_a);
    REQUIRE(a2_in_a1 * 10 >= a2_small_large * 9,
            "node 0 reused its own segments for only %d of %d blocks", a2_in_a1, a2_small_large);
    set_free(r->a2);
    set_free(r->b1);
    guest_sub_detail(
        "remote frees moved nothing: node 0 %.2f%% / %.2f%% local before / after, node "
        "1 %.2f%% local, no node-0 segment used by node 1, %d/%d of node 0's new blocks "
        "in its old segments",
        r->a1_share, r->a2_share, r->b1_share, a2_in_a1, a2_small_large);
    return GUEST_PASS;
}

/* ---- (c) interleave, and bind ---- */

struct spread_arg {
    double share[2]; /* of all pages, on node 0 / node 1 */
    char text[512];  /* per kind, "node0/node1" */
};

/* The mix on a node-0 thread: the share of its pages on node 0 and 1. */
static int spread_fn(void *arg) {
    struct spread_arg *a = arg;
    struct blockset *s = set_new();
    if (!s) return GUEST_FAIL;
    int r = GUEST_FAIL;
    struct pagecount all;
    if (!set_alloc_mix(s, 0x77)) {
        guest_sub_detail("malloc failed");
    } else if (set_share(s, 0, a->text, sizeof a->text, &all) >= 0) {
        a->share[0] = pct(all.on[0], all.pages);
        a->share[1] = pct(all.on[1], all.pages);
        size_t l = 0;
        for (int k = 0; k < K_COUNT && l < sizeof a->text; k++) {
            struct pagecount pc;
            if (set_pages(s, 1u << k, &pc) != 0 || pc.pages == 0) continue;
            l += (size_t)snprintf(a->text + l, sizeof a->text - l, "%s%s %.1f%%/%.1f%% of %ld",
                                  l ? ", " : "", kind_name[k], pct(pc.on[0], pc.pages),
                                  pct(pc.on[1], pc.pages), pc.pages);
        }
        r = GUEST_PASS;
    }
    set_free(s);
    set_delete(s);
    return r;
}

/* The configuration lull runs with contains want ("numa=interleave"). */
static bool config_has(const char *want, char *config, size_t len) {
    struct lull_counters *c = guest_map(sizeof *c);
    config[0] = '\0';
    if (!c) return false;
    if (lull_stats(c) == 0) snprintf(config, len, "%.*s", (int)sizeof c->config, c->config);
    munmap(c, sizeof *c);
    return strstr(config, want) != NULL;
}

static int sub_interleave(void) { /* LULL_CONF=numa=interleave */
    char config[LULL_COUNTERS_CONFIG_LEN];
    REQUIRE(config_has("numa=interleave", config, sizeof config), "config in force: %s", config);
    struct spread_arg a = {{0}, ""};
    if (guest_on_cpu(node_cpu(0), spread_fn, &a) != GUEST_PASS) return GUEST_FAIL;
    guest_sub_info("numa=interleave, thread on node 0, pages on node 0/1: %s", a.text);
    REQUIRE(a.share[0] >= 30 && a.share[0] <= 70 && a.share[1] >= 30 && a.share[1] <= 70,
            "interleave: %.1f%% on node 0, %.1f%% on node 1 (%s)", a.share[0], a.share[1], a.text);
    guest_sub_detail("numa=interleave: a node-0 thread's pages %.1f%% on node 0, %.1f%% on node 1",
                     a.share[0], a.share[1]);
    return GUEST_PASS;
}

static int sub_bind(void) { /* LULL_CONF=numa=bind,numa_nodes=1 */
    char config[LULL_COUNTERS_CONFIG_LEN];
    REQUIRE(config_has("numa=bind", config, sizeof config), "config in force: %s", config);
    struct spread_arg a = {{0}, ""};
    if (guest_on_cpu(node_cpu(0), spread_fn, &a) != GUEST_PASS) return GUEST_FAIL;
    guest_sub_info("numa=bind,numa_nodes=1, thread on node 0, pages on node 0/1: %s", a.text);
    REQUIRE(a.share[1] >= 99.0, "bind to node 1: only %.2f%% on node 1 (%s)", a.share[1], a.text);
    guest_sub_detail("numa=bind,numa_nodes=1: a node-0 thread's pages %.2f%% on node 1",
                     a.share[1]);
    return GUEST_PASS;
}

/* ---- (d) lull_thread_set_node ---- */

struct set_node_arg {
    bool warm; /* allocate and free a mix on the CPU's node first */
    int set_rc;
    double low;      /* lowest share on node 1 over the kinds */
    double back_low; /* after lull_thread_set_node(-1): share on node 0 */
    char text[512], back_text[512];
};

static int set_node_fn(void *arg) {
    struct set_node_arg *a = arg;
    struct blockset *s = set_new();
    if (!s) return GUEST_FAIL;
    int r = GUEST_FAIL;
    if (a->warm) {
        if (!set_alloc_mix(s, 0x31)) {
            guest_sub_detail("malloc failed before lull_thread_set_node");
            goto out;
        }
        set_free(s);
    }
    a->set_rc = lull_thread_set_node(1);
    if (a->set_rc != 0) {
        guest_sub_detail("lull_thread_set_node(1): %d", a->set_rc);
        goto out;
    }
    if (!set_alloc_mix(s, 0x32)) {
        guest_sub_detail("malloc failed after lull_thread_set_node(1)");
        goto out;
    }
    a->low = set_share(s, 1, a->text, sizeof a->text, NULL);
    set_free(s);
    if (a->low < 0) goto out; /* set_share said why */
    if (lull_thread_set_node(-1) != 0) {
        guest_sub_detail("lull_thread_set_node(-1) failed");
        goto out;
    }
    if (!set_alloc_mix(s, 0x33)) {
        guest_sub_detail("malloc failed after lull_thread_set_node(-1)");
        goto out;
    }
    a->back_low = set_share(s, 0, a->back_text, sizeof a->back_text, NULL);
    if (a->back_low >= 0) r = GUEST_PASS;
out:
    set_free(s);
    set_delete(s);
    return r;
}

static int sub_set_node(void) {
    struct set_node_arg fresh = {.warm = false}, warm = {.warm = true};
    if (guest_on_cpu(node_cpu(0), set_node_fn, &fresh) != GUEST_PASS) return GUEST_FAIL;
    guest_sub_info("new thread on node 0, lull_thread_set_node(1): on node 1 %s", fresh.text);
    guest_sub_info("then lull_thread_set_node(-1): on node 0 %s", fresh.back_text);
    if (guest_on_cpu(node_cpu(0), set_node_fn, &warm) != GUEST_PASS) return GUEST_FAIL;
    guest_sub_info(
        "thread on node 0 that allocated and freed first, lull_thread_set_node(1): on node "
        "1 %s",
        warm.text);
    guest_sub_info("then lull_thread_set_node(-1): on node 0 %s", warm.back_text);
    REQUIRE(fresh.low >= 99.0, "new thread pinned to node 1: %.2f%% on node 1 (%s)", fresh.low,
            fresh.text);
    REQUIRE(warm.low >= 99.0,
            "thread with cached node-0 memory pinned to node 1: %.2f%% on node 1 (%s)", warm.low,
            warm.text);
    REQUIRE(fresh.back_low >= 99.0 && warm.back_low >= 99.0,
            "back to its CPU's node: %.2f%% / %.2f%% on node 0 (%s / %s)", fresh.back_low,
            warm.back_low, fresh.back_text, warm.back_text);
    guest_sub_detail(
        "lull_thread_set_node(1) on node 0: >= %.2f%% on node 1 (new thread), >= %.2f%% "
        "(thread with cached memory); set_node(-1): >= %.2f%% back on node 0",
        fresh.low, warm.low, fresh.back_low < warm.back_low ? fresh.back_low : warm.back_low);
    return GUEST_PASS;
}

/* ---- (e) lull_stats per node ---- */

struct keep_arg {
    int node;
    struct blockset *s;
};

static int keep_fn(void *arg) {
    struct keep_arg *k = arg;
    return set_alloc_mix(k->s, 0x44) ? GUEST_PASS : GUEST_FAIL;
}

/* The identity of one accounting: "" when it holds, else what differs. */
static bool identity_holds(const struct lull_counters_accounting *a, char *why, size_t len) {
    uint64_t sum = lull_counters_accounting_sum(a);
    if (sum == a->mapped) return true;
    snprintf(why, len,
             "mapped %llu != sum %llu (live %llu rounding %llu span_free %llu dirty %llu purging "
             "%llu purged %llu warm %llu metadata %llu)",
             (unsigned long long)a->mapped, (unsigned long long)sum, (unsigned long long)a->live,
             (unsigned long long)a->rounding, (unsigned long long)a->span_free,
             (unsigned long long)a->dirty, (unsigned long long)a->purging,
             (unsigned long long)a->purged, (unsigned long long)a->warm,
             (unsigned long long)a->metadata);
    return false;
}

static int sub_stats_nodes(void) {
    struct keep_arg k[2] = {{0, set_new()}, {1, set_new()}};
    REQUIRE(k[0].s && k[1].s, "mmap failed");
    for (int n = 0; n < 2; n++)
        REQUIRE(guest_on_cpu(node_cpu(n), keep_fn, &k[n]) == GUEST_PASS, "malloc failed on node %d",
                n);
    struct lull_counters *c = guest_map(sizeof *c);
    REQUIRE(c, "mmap failed");
    /* The reclaim thread may move slices between terms while the figures
     * are gathered: a few tries. */
    char why[512] = "";
    int tries = 0;
    bool ok = false;
    for (; tries < 10 && !ok; tries++) {
        REQUIRE(lull_stats(c) == 0, "lull_stats failed");
        ok = identity_holds(&c->total, why, sizeof why);
        for (uint64_t n = 0; ok && n < c->node_count && n < LULL_COUNTERS_MAX_NODES; n++)
            if (!identity_holds(&c->nodes[n].acct, why, sizeof why)) {
                size_t l = strlen(why);
                snprintf(why + l, sizeof why - l, " on node entry %llu", (unsigned long long)n);
                ok = false;
            }
        if (!ok) usleep(20 * 1000);
    }
    for (uint64_t n = 0; n < c->node_count && n < LULL_COUNTERS_MAX_NODES; n++) {
        const struct lull_counters_accounting *a = &c->nodes[n].acct;
        guest_sub_info(
            "node %llu: mapped %llu KiB live %llu KiB rounding %llu span_free %llu dirty "
            "%llu purged %llu metadata %llu KiB",
            (unsigned long long)c->nodes[n].node_id, (unsigned long long)(a->mapped / KIB),
            (unsigned long long)(a->live / KIB), (unsigned long long)(a->rounding / KIB),
            (unsigned long long)(a->span_free / KIB), (unsigned long long)(a->dirty / KIB),
            (unsigned long long)(a->purged / KIB), (unsigned long long)(a->metadata / KIB));
    }
    REQUIRE(c->node_count == 2, "node_count %llu", (unsigned long long)c->node_count);
    REQUIRE(ok, "accounting identity broken in %d snapshots: %s", tries, why);
    REQUIRE(c->nodes[0].node_id == 0 && c->nodes[1].node_id == 1, "node ids %llu, %llu",
            (unsigned long long)c->nodes[0].node_id, (unsigned long long)c->nodes[1].node_id);
    for (int n = 0; n < 2; n++) {
        const struct lull_counters_accounting *a = &c->nodes[n].acct;
        REQUIRE(a->mapped > 0, "node %d: mapped 0", n);
        REQUIRE(a->live >= k[n].s->bytes,
                "node %d: live %llu < %zu bytes its thread holds (node %d live %llu)", n,
                (unsigned long long)a->live, k[n].s->bytes, 1 - n,
                (unsigned long long)c->nodes[1 - n].acct.live);
    }
    guest_sub_detail(
        "node_count 2, identity holds per node (after %d snapshot(s)); node 0 live %llu "
        "KiB of %llu mapped, node 1 live %llu KiB of %llu mapped",
        tries, (unsigned long long)(c->nodes[0].acct.live / KIB),
        (unsigned long long)(c->nodes[0].acct.mapped / KIB),
        (unsigned long long)(c->nodes[1].acct.live / KIB),
        (unsigned long long)(c->nodes[1].acct.mapped / KIB));
    set_free(k[0].s);
    set_free(k[1].s);
    return GUEST_PASS;
}

/* ---- the sub-checks and the checks ---- */

/* Each sub-check first makes sure lull runs on two nodes. */
#define NUMA_SUB(name, fn)                                                                         \
    static int fn##_two_nodes(void) {                                                              \
        return two_nodes() ? fn() : GUEST_FAIL;                                                    \
    }                                                                                              \
    GUEST_SUB(name, fn##_two_nodes)

NUMA_SUB("local", sub_local);
NUMA_SUB("remote_free", sub_remote_free);
NUMA_SUB("interleave", sub_interleave);
NUMA_SUB("bind", sub_bind);
NUMA_SUB("set_node", sub_set_node);
NUMA_SUB("stats_nodes", sub_stats_nodes);

/* Sub-check name in a fresh process with LULL_CONF=conf ("" none). */
static int run_sub(const char *name, const char *conf) {
    char env[256];
    snprintf(env, sizeof env, "LULL_CONF=%s", conf);
    const char *const envp[] = {env, NULL};
    return guest_sub_run(name, conf[0] ? envp : NULL);
}

GUEST_CHECK_TIMEOUT(lull_local, 180) {
    return run_sub("local", "");
}
GUEST_CHECK_TIMEOUT(lull_remote_free, 240) {
    return run_sub("remote_free", "");
}
GUEST_CHECK_TIMEOUT(lull_interleave, 120) {
    return run_sub("interleave", "numa=interleave");
}
GUEST_CHECK_TIMEOUT(lull_bind, 120) {
    return run_sub("bind", "numa=bind,numa_nodes=1");
}
GUEST_CHECK_TIMEOUT(lull_set_node, 240) {
    return run_sub("set_node", "");
}
GUEST_CHECK_TIMEOUT(lull_stats_nodes, 180) {
    return run_sub("stats_nodes", "");
}

#endif /* LULL_GUEST_NO_LIB */
