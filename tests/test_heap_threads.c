/* Thread heaps (src/heap.c): thread churn never grows the number of heaps
 * beyond the peak number of live threads (a dead thread's heap is adopted by
 * the next one), blocks a thread leaves behind can be freed by others, and
 * remote frees come back to the owner: memory freed by another thread is
 * reused instead of mapping more segments, also from a span that was full. */
#define _GNU_SOURCE
#include "lull.h"
#include "numa/arena.h"
#include "src/heap.h"
#include "src/outbox.h"
#include "src/reuse.h"
#include "src/size_class.h"
#include "src/span.h"
#include "tests/support/heap_count.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <sched.h>
#include <string.h>
#include <unistd.h>

#ifdef LULL_SANITIZED
#define SCALE 4
#else
#define SCALE 1
#endif

static uint32_t segments(void) {
    return atomic_load(&lull_arenas[0].segment_count);
}

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static bool check_block(const void *p, size_t size, uint64_t seed) {
    const uint64_t *w = p;
    size_t words = size / 8;
    for (size_t i = 0; i < words; i += 1 + i / 4)
        if (w[i] != mix((uintptr_t)p ^ seed ^ i)) return false;
    return true;
}

static void fill_block(void *p, size_t size, uint64_t seed) {
    uint64_t *w = p;
    size_t words = size / 8;
    for (size_t i = 0; i < words; i += 1 + i / 4)
        w[i] = mix((uintptr_t)p ^ seed ^ i);
}

/* ---- thread churn ------------------------------------------------------- */

#define CHURN_THREADS (2000 / SCALE)
#define CHURN_BATCH 4 /* threads alive at a time */
#define CHURN_BLOCKS 300
#define CHURN_LEFT 8 /* blocks each thread leaves alive */

typedef struct {
    uint64_t seed;
    void *left[CHURN_LEFT];
    size_t left_size[CHURN_LEFT];
    bool ok;
    lull_heap *heap;
} churn_arg;

static void *churn_thread(void *argp) {
    churn_arg *a = argp;
    uint64_t x = a->seed | 1;
    void *p[CHURN_BLOCKS];
    size_t sz[CHURN_BLOCKS];
    a->ok = true;
    for (int i = 0; i < CHURN_BLOCKS; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        sz[i] = x % 8 == 0 ? 1024 + (size_t)(x >> 8) % 60000 : 8 + (size_t)(x >> 8) % 500;
        p[i] = lull_malloc(sz[i]);
        if (!p[i]) {
            a->ok = false;
            return NULL;
        }
        fill_block(p[i], sz[i], a->seed);
        if (i % 3 == 2) { /* free some on the way */
            if (!check_block(p[i - 1], sz[i - 1], a->seed)) a->ok = false;
            lull_free(p[i - 1]);
            p[i - 1] = NULL;
        }
    }
    a->heap = lull_tl_heap;
    for (int i = 0, kept = 0; i < CHURN_BLOCKS; i++) {
        if (!p[i]) continue;
        if (!check_block(p[i], sz[i], a->seed)) a->ok = false;
        if (kept < CHURN_LEFT) {
            a->left[kept] = p[i];
            a->left_size[kept++] = sz[i];
        } else {
            lull_free(p[i]);
        }
    }
    return NULL;
}

Test(heap_threads, thread_churn_reuses_heaps, .timeout = 120) {
    void *warm = lull_malloc(100); /* the main thread's heap */
    unsigned heaps_before = heap_count();
    uint32_t segs_after_warmup = 0;
    static churn_arg args[CHURN_BATCH];
    static lull_heap *seen[64];
    unsigned distinct = 0;
    for (int t = 0; t < CHURN_THREADS; t += CHURN_BATCH) {
        pthread_t th[CHURN_BATCH];
        for (int i = 0; i < CHURN_BATCH; i++) {
            memset(&args[i], 0, sizeof args[i]);
            args[i].seed = (uint64_t)(t + i) * 7919 + 1;
            cr_assert_eq(pthread_create(&th[i], NULL, churn_thread, &args[i]), 0);
        }
        for (int i = 0; i < CHURN_BATCH; i++)
            pthread_join(th[i], NULL);
        for (int i = 0; i < CHURN_BATCH; i++) {
            cr_assert(args[i].ok, "thread %d: a block was overwritten", t + i);
            bool known = false;
            for (unsigned k = 0; k < distinct; k++)
                known |= seen[k] == args[i].heap;
            if (!known && distinct < 64) seen[distinct++] = args[i].heap;
            /* the main thread frees what the dead thread left: remote frees
             * into an abandoned (or re-adopted) heap */
            for (int k = 0; k < CHURN_LEFT; k++) {
                cr_assert(check_block(args[i].left[k], args[i].left_size[k], args[i].seed),
                          "a block left by thread %d was overwritten", t + i);
                lull_free(args[i].left[k]);
            }
        }
        if (t == 40) segs_after_warmup = segments();
    }
    unsigned heaps_after = heap_count();
    cr_log_info("heaps %u -> %u, %u distinct, segments %u -> %u", heaps_before, heaps_after,
                distinct, segs_after_warmup, segments());
    /* peak live: CHURN_BATCH workers; + main, the reclaim thread and a few
     * the test framework may run */
    cr_assert_leq(heaps_after, heaps_before + CHURN_BATCH + 2,
                  "%d threads (at most %d alive) left %u heaps (%u before)", CHURN_THREADS,
                  CHURN_BATCH, heaps_after, heaps_before);
    cr_assert_leq(distinct, CHURN_BATCH + 2u, "threads used %u distinct heaps", distinct);
    /* and memory does not grow with the number of threads that lived */
    cr_assert_leq(segments(), segs_after_warmup + 2, "segments grew from %u to %u",
                  segs_after_warmup, segments());
    lull_free(warm);
}

/* ---- remote frees: A allocates, B frees, A allocates again -------------- */

#define REMOTE_BLOCKS (100000 / SCALE)
#define REMOTE_ROUNDS 5

static void **remote_ptrs;
static pthread_barrier_t remote_bar;
static atomic_bool remote_bad;
static lull_heap *remote_heap_a, *remote_heap_b;

static size_t remote_size(int i) {
    return 16 + (size_t)(mix((uint64_t)i) % 1000);
}

static void *remote_a(void *arg) {
    uint32_t *segs = arg;
    for (int round = 0; round < REMOTE_ROUNDS; round++) {
        for (int i = 0; i < REMOTE_BLOCKS; i++) {
            remote_ptrs[i] = lull_malloc(remote_size(i));
            if (!remote_ptrs[i]) {
                atomic_store(&remote_bad, true);
                break;
            }
            *(uint64_t *)remote_ptrs[i] = (uint64_t)i ^ 0xabcdef;
        }
        remote_heap_a = lull_tl_heap;
        segs[round] = segments();
        pthread_barrier_wait(&remote_bar); /* B frees them all */
        pthread_barrier_wait(&remote_bar);
    }
    return NULL;
}

static void *remote_b(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8)); /* a heap of its own, where its frees are counted */
    for (int round = 0; round < REMOTE_ROUNDS; round++) {
        pthread_barrier_wait(&remote_bar);
        for (int i = 0; i < REMOTE_BLOCKS; i++) {
            if (!remote_ptrs[i]) continue;
            if (*(uint64_t *)remote_ptrs[i] != ((uint64_t)i ^ 0xabcdef))
                atomic_store(&remote_bad, true);
            lull_free(remote_ptrs[i]);
        }
        remote_heap_b = lull_tl_heap;
        pthread_barrier_wait(&remote_bar);
    }
    return NULL;
}

Test(heap_threads, remote_frees_are_reused_by_the_owner, .timeout = 120) {
    remote_ptrs = lull_calloc(REMOTE_BLOCKS, sizeof(void *));
    cr_assert_not_null(remote_ptrs);
    pthread_barrier_init(&remote_bar, NULL, 2);
    uint32_t segs[REMOTE_ROUNDS];
    pthread_t a, b;
    pthread_create(&a, NULL, remote_a, segs);
    pthread_create(&b, NULL, remote_b, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    cr_assert_not(atomic_load(&remote_bad), "a block was lost or overwritten");
    /* the remote frees were counted on the freeing thread's heap */
    cr_assert_geq(remote_heap_b->frees, (uint64_t)REMOTE_BLOCKS * (REMOTE_ROUNDS - 1));
    cr_log_info("segments per round: %u %u %u %u %u", segs[0], segs[1], segs[2], segs[3], segs[4]);
    /* rounds 2..5 reuse what B freed: no new segments after round 1 (one
     * of slack for spans still on A's remote stack) */
    for (int r = 1; r < REMOTE_ROUNDS; r++)
        cr_assert_leq(segs[r], segs[0] + 1, "round %d: %u segments after %u in round 1", r + 1,
                      segs[r], segs[0]);
    lull_free(remote_ptrs);
}

/* ---- a remote free into a full span ------------------------------------- */

#define FULL_SIZE 1024

static void *full_ptrs[4096];
static unsigned full_n;
static void *full_victim;
static pthread_barrier_t full_bar;
static long full_found_after = -1;
static lull_span *full_span;
static bool full_was_full;
static uint64_t full_remote_before, full_remote_after;

static void *full_owner(void *arg) {
    (void)arg;
    unsigned c = lull_class_of(FULL_SIZE);
    unsigned cap = lull_classes[c].capacity;
    /* fill one span and start the next: the first one is parked as full */
    for (unsigned i = 0; i < cap + 1; i++)
        full_ptrs[full_n++] = lull_malloc(FULL_SIZE);
    full_victim = full_ptrs[cap / 2];
    full_span = lull_span_of(lull_segment_of(full_victim), full_victim);
    full_was_full = lull_span_in_full(full_span) && full_span->free == NULL;
    pthread_barrier_wait(&full_bar); /* the other thread frees the victim */
    pthread_barrier_wait(&full_bar);
    for (unsigned i = 0; i < 2 * cap && full_n < 4096; i++) {
        void *p = lull_malloc(FULL_SIZE);
        full_ptrs[full_n++] = p;
        if (p == full_victim) {
            full_found_after = i;
            break;
        }
    }
    for (unsigned i = 0; i < full_n; i++)
        if (full_ptrs[i] != full_victim || (long)i == (long)full_n - 1) lull_free(full_ptrs[i]);
    return NULL;
}

static void *full_freer(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8)); /* a heap of its own, where its frees are counted */
    pthread_barrier_wait(&full_bar);
    full_remote_before = lull_tl_heap->frees;
    lull_free(full_victim);
    full_remote_after = lull_tl_heap->frees;
    lull_thread_collect(); /* sends the free (outbox.h), as its next refill would */
    pthread_barrier_wait(&full_bar);
    return NULL;
}

/* Run an owner and a freer thread, which meet at `bar`, to their end. */
static void run_pair(pthread_barrier_t *bar, void *(*owner)(void *), void *(*freer)(void *)) {
    pthread_barrier_init(bar, NULL, 2);
    pthread_t a, b;
    pthread_create(&a, NULL, owner, NULL);
    pthread_create(&b, NULL, freer, NULL);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    pthread_barrier_destroy(bar);
}

Test(heap_threads, a_remote_free_into_a_full_span_comes_back_to_the_owner) {
    lull_size_classes_init();
    run_pair(&full_bar, full_owner, full_freer);
    unsigned cap = lull_classes[lull_class_of(FULL_SIZE)].capacity;
    cr_log_info("capacity %u, victim back after %ld mallocs", cap, full_found_after);
    cr_assert(full_was_full, "the first span was not parked as full");
    cr_assert_eq(full_remote_after, full_remote_before + 1, "the remote free was not counted");
    cr_assert_geq(full_found_after, 0, "the block freed remotely never came back in %u mallocs",
                  2 * cap);
    cr_assert_leq(full_found_after, (long)cap);
}

/* ---- a thread's leftover blocks, freed after it died -------------------- */

static void *leave_blocks(void *arg) {
    void **out = arg;
    for (int i = 0; i < 1000; i++) {
        out[i] = lull_malloc(48 + (size_t)(i % 7) * 100);
        memset(out[i], i & 0xff, 48);
    }
    return NULL;
}

static void *reuse_blocks(void *arg) {
    (void)arg;
    /* adopts the dead thread's heap; the blocks freed in the meantime by
     * main are found again, so the spans are not leaked */
    for (int i = 0; i < 1000; i++)
        lull_free(lull_malloc(48 + (size_t)(i % 7) * 100));
    lull_thread_collect();
    return NULL;
}

Test(heap_threads, blocks_of_a_dead_thread_are_freed_and_reused) {
    void *first = lull_malloc(64);
    static void *blocks[1000];
    uint32_t segs0 = 0;
    for (int round = 0; round < 30; round++) {
        pthread_t t;
        pthread_create(&t, NULL, leave_blocks, blocks);
        pthread_join(t, NULL);
        for (int i = 0; i < 1000; i++) {
            cr_assert_eq(((unsigned char *)blocks[i])[47], (unsigned char)(i & 0xff));
            lull_free(blocks[i]);
        }
        pthread_create(&t, NULL, reuse_blocks, NULL);
        pthread_join(t, NULL);
        if (round == 2) segs0 = segments();
    }
    cr_assert_leq(segments(), segs0 + 1);
    lull_free(first);
}

/* ---- remote frees go out in messages (src/outbox.h) ---------------------- */

#define MSG_SIZE 256 /* 64 blocks a message: 16 KiB, under the byte bound */

static pthread_barrier_t msg_bar;
static void *msg_blocks[LULL_OUTBOX_BATCH];
static unsigned msg_to_free;
static lull_span *msg_span;
static uint32_t msg_used[3];

/* A message's worth of blocks in one span, and one more block that keeps
 * the span in use when they are all freed: returned, for the caller to
 * free at its end. */
static void *fill_one_span(void **blocks, lull_span **span) {
    for (unsigned i = 0; i < LULL_OUTBOX_BATCH; i++)
        blocks[i] = lull_malloc(MSG_SIZE);
    *span = lull_span_of(lull_segment_of(blocks[0]), blocks[0]);
    return lull_malloc(MSG_SIZE);
}

static void *msg_owner(void *arg) {
    (void)arg;
    void *keep = fill_one_span(msg_blocks, &msg_span);
    msg_used[0] = lull_span_used(msg_span);
    pthread_barrier_wait(&msg_bar); /* the freer frees msg_to_free blocks */
    pthread_barrier_wait(&msg_bar);
    lull_thread_collect(); /* applies what reached its inbox */
    msg_used[1] = lull_span_used(msg_span);
    pthread_barrier_wait(&msg_bar); /* the freer collects: it sends the rest */
    pthread_barrier_wait(&msg_bar);
    lull_thread_collect();
    msg_used[2] = lull_span_used(msg_span);
    for (unsigned i = msg_to_free; i < LULL_OUTBOX_BATCH; i++)
        lull_free(msg_blocks[i]);
    lull_free(keep);
    return NULL;
}

static void *msg_freer(void *arg) {
    (void)arg;
    lull_free(lull_malloc(8)); /* a heap of its own */
    pthread_barrier_wait(&msg_bar);
    for (unsigned i = 0; i < msg_to_free; i++)
        lull_free(msg_blocks[i]);
    pthread_barrier_wait(&msg_bar);
    pthread_barrier_wait(&msg_bar);
    lull_thread_collect();
    pthread_barrier_wait(&msg_bar);
    return NULL;
}

/* The owner's span count after the freer freed n of its blocks and before
 * and after the freer collected. */
static void run_message(unsigned n) {
    msg_to_free = n;
    run_pair(&msg_bar, msg_owner, msg_freer);
    cr_log_info("%u freed: used %u, %u before the freer collected, %u after", n, msg_used[0],
                msg_used[1], msg_used[2]);
}

/* A full message goes out by itself: the owner gets all 64 frees back while
 * the freer does nothing more. */
Test(heap_threads, a_full_message_reaches_the_owner_without_the_freers_help) {
    lull_size_classes_init();
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    run_message(LULL_OUTBOX_BATCH);
    cr_assert_eq(msg_used[1], msg_used[0] - LULL_OUTBOX_BATCH);
    cr_assert_eq(msg_used[2], msg_used[1]);
}

/* One free short of a message waits in the freer's outbox (that is the
 * batching) until the freer collects, takes a new span or exits. */
Test(heap_threads, a_partial_message_waits_until_the_freer_sends_it) {
    lull_size_classes_init();
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    run_message(LULL_OUTBOX_BATCH - 1);
    cr_assert_eq(msg_used[1], msg_used[0], "frees came back before the freer sent them");
    cr_assert_eq(msg_used[2], msg_used[0] - (LULL_OUTBOX_BATCH - 1));
}

/* A thread that no longer allocates but frees other threads' blocks gets
 * back, at its next send, what others sent it: the owner here hands its
 * blocks to a freer and then only frees the freer's blocks (a thread that
 * handed its work to a pool). Before, the owner's inbox waited for a refill
 * that never came: in bench/footprint's pool_larson, 26 MiB of freed blocks
 * stayed counted live in the main thread's inbox after the pool exited. */
static pthread_barrier_t back_bar;
static void *back_mine[LULL_OUTBOX_BATCH], *back_theirs[LULL_OUTBOX_BATCH];
static lull_span *back_span;
static uint32_t back_used[2];

static void *back_owner(void *arg) {
    (void)arg;
    void *keep = fill_one_span(back_mine, &back_span);
    pthread_barrier_wait(&back_bar); /* the freer frees back_mine: a full message */
    pthread_barrier_wait(&back_bar);
    back_used[0] = lull_span_used(back_span);
    for (unsigned i = 0; i < LULL_OUTBOX_BATCH; i++) /* one full message of its own */
        lull_free(back_theirs[i]);
    back_used[1] = lull_span_used(back_span);
    lull_free(keep);
    return NULL;
}

static void *back_freer(void *arg) {
    (void)arg;
    for (unsigned i = 0; i < LULL_OUTBOX_BATCH; i++)
        back_theirs[i] = lull_malloc(MSG_SIZE);
    pthread_barrier_wait(&back_bar);
    for (unsigned i = 0; i < LULL_OUTBOX_BATCH; i++)
        lull_free(back_mine[i]);
    pthread_barrier_wait(&back_bar);
    return NULL;
}

Test(heap_threads, a_thread_that_only_frees_gets_back_what_was_sent_to_it) {
    lull_size_classes_init();
    lull_reuse_max_bytes = 0; /* every remote free goes out in a message */
    run_pair(&back_bar, back_owner, back_freer);
    cr_log_info("used %u before its own send, %u after", back_used[0], back_used[1]);
    cr_assert_eq(back_used[0], LULL_OUTBOX_BATCH + 1, "applied before the owner did anything");
    cr_assert_eq(back_used[1], 1, "the frees sent to the owner were not applied at its send");
}

/* Detached threads that never allocate: at exit, after their TSD
 * destructors, glibc frees the TLS vectors of other cached stacks (blocks
 * of the creating thread's heap). lull gave such a thread a heap there,
 * which no destructor abandons: one heap lost a thread (session 22's
 * review: 160 threads, 102 heaps). Bursts of 16 at once, so that their
 * stacks pass glibc's 40 MiB cache and it frees some. */
#define QUIET_BURST 16
#define QUIET_BURSTS 10
static pthread_barrier_t quiet_barrier;
static atomic_int quiet_live;

static void *quiet_thread(void *arg) {
    pthread_barrier_wait(&quiet_barrier);
    atomic_fetch_sub(&quiet_live, 1);
    return arg;
}

Test(heap_threads, threads_that_never_allocate_leave_no_heap, .timeout = 120) {
    cr_assert(lull_reclaim_now(), "no reclaim thread");
    lull_free(lull_malloc(100)); /* the main thread's heap */
    unsigned heaps_before = heap_count();
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    for (int b = 0; b < QUIET_BURSTS; b++) {
        pthread_barrier_init(&quiet_barrier, NULL, QUIET_BURST);
        atomic_store(&quiet_live, QUIET_BURST);
        for (int i = 0; i < QUIET_BURST; i++) {
            pthread_t t;
            cr_assert_eq(pthread_create(&t, &attr, quiet_thread, NULL), 0);
        }
        while (atomic_load(&quiet_live))
            sched_yield();
        /* gone past their exit: a detached thread's end is not joinable;
         * the next burst's creation reuses (and frees from) their stacks */
        usleep(20000);
        pthread_barrier_destroy(&quiet_barrier);
    }
    pthread_attr_destroy(&attr);
    unsigned heaps = heap_count();
    cr_log_info("%u heaps before, %u after %d threads that never allocated", heaps_before, heaps,
                QUIET_BURST * QUIET_BURSTS);
    cr_assert_leq(heaps, heaps_before + 2,
                  "%u heaps after %d threads that never allocated (%u before)", heaps,
                  QUIET_BURST * QUIET_BURSTS, heaps_before);
}
