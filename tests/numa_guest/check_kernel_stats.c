/* Kernel check: the accounting identity after a mixed workload (group
 * "kernel").
 *
 *   kernel_identity   two threads allocate the mix (small, multi-slice,
 *                     large, huge), each frees half of its own blocks and
 *                     half of the other's (remote frees), grows a block by
 *                     realloc to 40 MiB, lull_purge_all() runs between the
 *                     rounds; then, with blocks still live and the reclaim
 *                     thread purging, lull_stats() must show
 *                     live + rounding + span_free + dirty + purging + purged
 *                     + warm + metadata == mapped overall and on every node,
 *                     the nodes summing to the totals (the logic of
 *                     tests/support/stats_check.c), and live at least what
 *                     the threads hold.
 *
 * The reclaim thread may move bytes between terms while lull_stats()
 * gathers them (the purge delay is 0 here): a snapshot is taken again, up
 * to 10 times, before the identity is called broken. */
#ifndef LULL_GUEST_NO_LIB
#define _GNU_SOURCE
#define GUEST_GROUP "kernel"
#include "guest.h"
#include "guest_lull.h"

#include "lull.h"
#include "lull/counters.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct worker {
    struct gset *own;
    struct gset *other; /* the other thread's set: it frees the odd half */
    pthread_barrier_t *step;
    char *grown;
    size_t held; /* bytes it still holds at the end */
    bool ok;
};

static void *worker_main(void *arg) {
    struct worker *w = arg;
    w->ok = gset_alloc_mix(w->own, 0x3c);
    pthread_barrier_wait(w->step); /* both sets ready */
    if (w->ok) {
        for (int i = 0; i < w->own->n; i += 2) { /* even: own blocks */
            free(w->own->p[i]);
            w->own->p[i] = NULL;
        }
        for (int i = 1; i < w->other->n; i += 4) { /* every other odd one: remote */
            free(w->other->p[i]);
            w->other->p[i] = NULL;
        }
        char *r = malloc(100);
        for (size_t n = 1000; r && n <= 40 * MIB; n *= 4) {
            char *q = realloc(r, n);
            if (!q) break;
            r = q;
            memset(r, 7, n);
        }
        w->grown = r;
        lull_thread_collect(); /* its remote frees go out now */
    }
    pthread_barrier_wait(w->step); /* both freed */
    pthread_barrier_wait(w->step); /* purge_all done by main */
    if (w->ok) {                   /* a second round of small blocks on the purged slices */
        for (int i = 0; i < w->own->n; i += 2)
            if (!w->own->p[i] && w->own->size[i] <= 7000) {
                w->own->p[i] = malloc(w->own->size[i]);
                if (w->own->p[i]) memset(w->own->p[i], 5, w->own->size[i]);
            }
    }
    return NULL;
}

static size_t still_held(const struct gset *s) {
    size_t b = 0;
    for (int i = 0; i < s->n; i++)
        if (s->p[i]) b += s->size[i];
    return b;
}

static void free_rest(struct gset *s) {
    for (int i = 0; i < s->n; i++)
        free(s->p[i]);
    gset_forget(s);
}

static int sub_identity(void) {
    if (!guest_lull_ours()) return GUEST_FAIL;
    GUEST_SUB_REQUIRE(lull_reclaim_now(), "the reclaim thread is not running");
    struct gset *a = gset_new(), *b = gset_new();
    GUEST_SUB_REQUIRE(a && b, "mmap failed");
    pthread_barrier_t step;
    pthread_barrier_init(&step, NULL, 3);
    struct worker w[2] = {{a, b, &step, NULL, 0, false}, {b, a, &step, NULL, 0, false}};
    pthread_t t[2];
    for (int i = 0; i < 2; i++)
        GUEST_SUB_REQUIRE(pthread_create(&t[i], NULL, worker_main, &w[i]) == 0, "pthread_create");
    pthread_barrier_wait(&step); /* ready */
    pthread_barrier_wait(&step); /* freed */
    lull_purge_all();
    struct lull_counters mid;
    GUEST_SUB_REQUIRE(stats_now(&mid), "lull_stats failed");
    pthread_barrier_wait(&step); /* second round */
    for (int i = 0; i < 2; i++)
        pthread_join(t[i], NULL);
    GUEST_SUB_REQUIRE(w[0].ok && w[1].ok, "malloc failed in a worker");
    size_t held = still_held(a) + still_held(b);
    size_t grown = 0;
    for (int i = 0; i < 2; i++)
        if (w[i].grown) grown += lull_usable_size(w[i].grown);

    char why[512] = "", why_mid[512] = "";
    bool mid_ok = stats_identity(&mid, why_mid, sizeof why_mid);
    struct lull_counters c;
    bool ok = false;
    int tries = 0;
    for (; tries < 10 && !ok; tries++) {
        GUEST_SUB_REQUIRE(stats_now(&c), "lull_stats failed");
        ok = stats_identity(&c, why, sizeof why);
        if (!ok) usleep(20 * 1000);
    }
    const struct lull_counters_accounting *t0 = &c.total;
    guest_sub_info(
        "after lull_purge_all: mapped %llu KiB, purged %llu KiB, dirty %llu KiB (%s)",
        (unsigned long long)(mid.total.mapped / KIB), (unsigned long long)(mid.total.purged / KIB),
        (unsigned long long)(mid.total.dirty / KIB), mid_ok ? "identity holds" : why_mid);
    guest_sub_info("end: mapped %llu = live %llu + rounding %llu + span_free %llu + dirty %llu + "
                   "purging %llu + purged %llu + warm %llu + metadata %llu KiB; %llu node(s)",
                   (unsigned long long)(t0->mapped / KIB), (unsigned long long)(t0->live / KIB),
                   (unsigned long long)(t0->rounding / KIB),
                   (unsigned long long)(t0->span_free / KIB), (unsigned long long)(t0->dirty / KIB),
                   (unsigned long long)(t0->purging / KIB), (unsigned long long)(t0->purged / KIB),
                   (unsigned long long)(t0->warm / KIB), (unsigned long long)(t0->metadata / KIB),
                   (unsigned long long)c.node_count);
    GUEST_SUB_REQUIRE(mid_ok, "identity broken after lull_purge_all: %s", why_mid);
    GUEST_SUB_REQUIRE(ok, "identity broken in %d snapshots: %s", tries, why);
    GUEST_SUB_REQUIRE(t0->live >= held + grown, "live %llu < %zu bytes the threads hold",
                      (unsigned long long)t0->live, held + grown);
    guest_sub_detail("identity holds overall and on %llu node(s) (after %d snapshot(s)) with %zu "
                     "KiB live in the workload: mapped %llu KiB, live %llu, purged %llu, dirty "
                     "%llu, metadata %llu KiB; backend %s",
                     (unsigned long long)c.node_count, tries, (held + grown) / KIB,
                     (unsigned long long)(t0->mapped / KIB), (unsigned long long)(t0->live / KIB),
                     (unsigned long long)(t0->purged / KIB), (unsigned long long)(t0->dirty / KIB),
                     (unsigned long long)(t0->metadata / KIB),
                     lull_counters_backend_name(c.backend));
    free_rest(a);
    free_rest(b);
    for (int i = 0; i < 2; i++)
        free(w[i].grown);
    return GUEST_PASS;
}
GUEST_SUB("kernel_identity", sub_identity);

GUEST_CHECK_TIMEOUT(kernel_identity, 180) {
    return guest_lull_sub("kernel_identity", "counter_page=off,purge_delay_ms=0", NULL);
}

#endif /* LULL_GUEST_NO_LIB */
