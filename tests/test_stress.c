/* Multi-threaded stress of the whole allocator: four threads allocate (malloc,
 * calloc, aligned_alloc, posix_memalign), free, realloc and hand blocks to
 * each other through locked queues, with sizes from 1 B to 1 MiB skewed to
 * small and some huge ones of 17-40 MiB. Every block carries a pattern
 * derived from its address, its size and a seed, checked before it is freed
 * or moved: a block handed out twice, overlapping another, or corrupted by a
 * purge or a free-list write shows up as a broken pattern. */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#ifdef LULL_SANITIZED
#define OPS_PER_THREAD 15000
#else
#define OPS_PER_THREAD 40000
#endif
#define THREADS 4
#define LOCAL_MAX 256
#define QUEUE_CAP 512
#define MiB ((size_t)1 << 20)

typedef struct {
    void *p;
    size_t size;
    uint64_t seed;
} obj;

typedef struct {
    pthread_mutex_t lock;
    obj items[QUEUE_CAP];
    unsigned head, count;
} queue;

static queue queues[THREADS];
static atomic_bool failed;
static char fail_msg[512];
static atomic_int senders_done;
static atomic_ulong total_ops, huge_allocs, aligned_allocs, reallocs, handoffs;

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail(const char *fmt, ...) {
    if (atomic_exchange(&failed, true)) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(fail_msg, sizeof fail_msg, fmt, ap);
    va_end(ap);
}

/* Offsets of the pattern's words: every word of a small block, one word per
 * 256 bytes of a bigger one, one per 16 pages above 1 MiB (page faults are
 * slow in some VMs), and the last word. */
static size_t step_for(size_t size) {
    return size <= 4096 ? 8 : size <= MiB ? 256 : 65536;
}

static void words_fill(void *p, size_t size, uint64_t seed) {
    uint8_t *b = p;
    size_t st = step_for(size);
    for (size_t off = 0; off + 16 <= size; off += st) { /* not over the last word */
        uint64_t v = mix64((uintptr_t)p ^ seed ^ off ^ size);
        memcpy(b + off, &v, 8);
    }
    if (size >= 8) {
        uint64_t v = mix64((uintptr_t)p ^ seed ^ (size - 8) ^ size);
        memcpy(b + size - 8, &v, 8);
    } else {
        for (size_t i = 0; i < size; i++)
            b[i] = (uint8_t)mix64((uintptr_t)p ^ seed ^ i ^ 77);
    }
}

/* Check the pattern written at `orig` for `size` bytes, now at p, over the
 * first `keep` bytes (keep < size after a shrinking realloc). */
static bool words_check(const void *p, const void *orig, size_t size, size_t keep, uint64_t seed) {
    const uint8_t *b = p;
    size_t st = step_for(size);
    for (size_t off = 0; off + 8 <= keep && off + 16 <= size; off += st) {
        uint64_t v;
        memcpy(&v, b + off, 8);
        if (v != mix64((uintptr_t)orig ^ seed ^ off ^ size)) return false;
    }
    if (size >= 8) {
        if (keep == size) {
            uint64_t v;
            memcpy(&v, b + size - 8, 8);
            if (v != mix64((uintptr_t)orig ^ seed ^ (size - 8) ^ size)) return false;
        }
    } else {
        for (size_t i = 0; i < size && i < keep; i++)
            if (b[i] != (uint8_t)mix64((uintptr_t)orig ^ seed ^ i ^ 77)) return false;
    }
    return true;
}

typedef struct {
    int id;
    uint64_t rng;
    obj local[LOCAL_MAX];
    unsigned n;
} worker;

static uint64_t rnd(worker *w) {
    uint64_t x = w->rng;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    return w->rng = x;
}

static size_t pick_size(worker *w) {
    uint64_t r = rnd(w) % 10000;
    uint64_t x = rnd(w);
    if (r < 7000) return 1 + x % 256;
    if (r < 9000) return 257 + x % (16 << 10);
    if (r < 9900) return (16 << 10) + x % (240 << 10);
    if (r < 9997) return (256 << 10) + x % (768 << 10);
    return (17 * MiB) + x % (23 * MiB); /* huge: 17-40 MiB */
}

static bool drop(obj *o, const char *why) {
    if (!words_check(o->p, o->p, o->size, o->size, o->seed)) {
        fail("%s: pattern of %zu-byte block %p broken", why, o->size, o->p);
        return false;
    }
    if (o->size && lull_usable_size(o->p) < o->size) {
        fail("%s: usable size %zu < %zu", why, lull_usable_size(o->p), o->size);
        return false;
    }
    lull_free(o->p);
    return true;
}

static bool new_obj(worker *w, obj *o) {
    size_t size = pick_size(w);
    uint64_t kind = rnd(w) % 100;
    void *p = NULL;
    if (kind < 60) {
        p = lull_malloc(size);
    } else if (kind < 75) {
        p = lull_calloc(1, size);
        if (p) {
            const uint8_t *b = p;
            size_t st = size > 65536 ? 4096 : 1;
            for (size_t i = 0; i < size; i += st)
                if (b[i]) {
                    fail("calloc(%zu) = %p not zero at %zu", size, p, i);
                    return false;
                }
        }
    } else {
        size_t align = (size_t)8 << (rnd(w) % 10); /* 8 .. 4096 */
        if (rnd(w) % 50 == 0) align = rnd(w) % 2 ? (size_t)64 << 10 : MiB;
        if (kind < 90) {
            p = lull_aligned_alloc(align, size);
        } else if (lull_posix_memalign(&p, align, size) != 0) {
            p = NULL;
        }
        if (p && (uintptr_t)p % align) {
            fail("aligned %zu: %p", align, p);
            return false;
        }
        atomic_fetch_add_explicit(&aligned_allocs, 1, memory_order_relaxed);
    }
    if (!p) {
        fail("allocation of %zu bytes failed", size);
        return false;
    }
    if (lull_usable_size(p) < size) {
        fail("usable size %zu < %zu", lull_usable_size(p), size);
        return false;
    }
    if (size > 16 * MiB) atomic_fetch_add_explicit(&huge_allocs, 1, memory_order_relaxed);
    o->p = p;
    o->size = size;
    o->seed = rnd(w);
    words_fill(p, size, o->seed);
    return true;
}

static bool re_alloc(worker *w, obj *o) {
    size_t size;
    uint64_t r = rnd(w) % 100;
    if (r < 45)
        size = o->size + 1 + rnd(w) % (o->size + 64); /* grow */
    else if (r < 90)
        size = o->size / (2 + rnd(w) % 3) + 1; /* shrink */
    else
        size = pick_size(w);
    if (size > 40 * MiB) size = 40 * MiB;
    if (!words_check(o->p, o->p, o->size, o->size, o->seed)) {
        fail("before realloc: pattern of %zu-byte block %p broken", o->size, o->p);
        return false;
    }
    void *q = lull_realloc(o->p, size);
    if (!q) {
        fail("realloc(%p, %zu) failed", o->p, size);
        return false;
    }
    size_t keep = size < o->size ? size : o->size;
    if (!words_check(q, o->p, o->size, keep, o->seed)) {
        fail("realloc %zu -> %zu (%p -> %p) lost contents", o->size, size, o->p, q);
        return false;
    }
    if (lull_usable_size(q) < size) {
        fail("realloc: usable %zu < %zu", lull_usable_size(q), size);
        return false;
    }
    if (size > 16 * MiB && o->size <= 16 * MiB)
        atomic_fetch_add_explicit(&huge_allocs, 1, memory_order_relaxed);
    o->p = q;
    o->size = size;
    o->seed = rnd(w);
    words_fill(q, size, o->seed);
    atomic_fetch_add_explicit(&reallocs, 1, memory_order_relaxed);
    return true;
}

static bool send_to(int to, obj *o) {
    queue *q = &queues[to];
    pthread_mutex_lock(&q->lock);
    bool ok = q->count < QUEUE_CAP;
    if (ok) q->items[(q->head + q->count++) % QUEUE_CAP] = *o;
    pthread_mutex_unlock(&q->lock);
    return ok;
}

static unsigned receive(int me, obj *out, unsigned max) {
    queue *q = &queues[me];
    pthread_mutex_lock(&q->lock);
    unsigned n = 0;
    while (q->count && n < max) {
        out[n++] = q->items[q->head];
        q->head = (q->head + 1) % QUEUE_CAP;
        q->count--;
    }
    pthread_mutex_unlock(&q->lock);
    return n;
}

/* Take one object out of the local set (swap with the last). */
static obj take(worker *w, unsigned i) {
    obj o = w->local[i];
    w->local[i] = w->local[--w->n];
    return o;
}

static void *stress_thread(void *arg) {
    worker *w = arg;
    obj in[64];
    for (int op = 0; op < OPS_PER_THREAD && !atomic_load_explicit(&failed, memory_order_relaxed);
         op++) {
        uint64_t r = rnd(w) % 100;
        if (r < 40 || w->n == 0) {
            if (w->n == LOCAL_MAX) {
                obj o = take(w, (unsigned)(rnd(w) % w->n));
                if (!drop(&o, "free (full)")) break;
            }
            if (!new_obj(w, &w->local[w->n])) break;
            w->n++;
        } else if (r < 60) {
            obj o = take(w, (unsigned)(rnd(w) % w->n));
            if (!drop(&o, "free")) break;
        } else if (r < 75) {
            if (!re_alloc(w, &w->local[rnd(w) % w->n])) break;
        } else if (r < 90) {
            int to = (int)((unsigned)w->id + 1 + (unsigned)(rnd(w) % (THREADS - 1))) % THREADS;
            obj o = take(w, (unsigned)(rnd(w) % w->n));
            if (send_to(to, &o)) {
                atomic_fetch_add_explicit(&handoffs, 1, memory_order_relaxed);
            } else if (!drop(&o, "free (queue full)")) {
                break;
            }
        } else {
            unsigned n = receive(w->id, in, 64);
            for (unsigned i = 0; i < n; i++) {
                /* keep some (they are freed or reallocated here later) */
                if (w->n < LOCAL_MAX && rnd(w) % 2) {
                    if (!words_check(in[i].p, in[i].p, in[i].size, in[i].size, in[i].seed)) {
                        fail("received block %p (%zu B) broken", in[i].p, in[i].size);
                        break;
                    }
                    w->local[w->n++] = in[i];
                } else if (!drop(&in[i], "free (received)")) {
                    break;
                }
            }
        }
        atomic_fetch_add_explicit(&total_ops, 1, memory_order_relaxed);
    }
    /* wait until nobody sends any more, then empty the inbox and the set */
    atomic_fetch_add(&senders_done, 1);
    while (atomic_load(&senders_done) < THREADS)
        sched_yield();
    unsigned n;
    while ((n = receive(w->id, in, 64)) > 0)
        for (unsigned i = 0; i < n; i++)
            drop(&in[i], "final (received)");
    while (w->n) {
        obj o = take(w, w->n - 1);
        drop(&o, "final");
    }
    return NULL;
}

Test(stress, four_threads_hand_blocks_around, .timeout = 300) {
    static worker workers[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        pthread_mutex_init(&queues[i].lock, NULL);
        workers[i].id = i;
        workers[i].rng = 0x243f6a8885a308d3ULL * (uint64_t)(i + 1);
    }
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, stress_thread, &workers[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_not(atomic_load(&failed), "%s", fail_msg);
    cr_log_info("%lu ops, %lu reallocs, %lu aligned, %lu huge, %lu hand-offs",
                atomic_load(&total_ops), atomic_load(&reallocs), atomic_load(&aligned_allocs),
                atomic_load(&huge_allocs), atomic_load(&handoffs));
    cr_assert_eq(atomic_load(&total_ops), (unsigned long)THREADS * OPS_PER_THREAD);
    /* the mix really happened */
    cr_assert_gt(atomic_load(&handoffs), 1000ul);
    cr_assert_gt(atomic_load(&reallocs), 1000ul);
    cr_assert_gt(atomic_load(&aligned_allocs), 1000ul);
    cr_assert_gt(atomic_load(&huge_allocs), 0ul);
}

/* The same storm while the reclaim thread purges every freed slice at once
 * (purge delay 0): no live block loses its pattern to a purge. */
Test(stress, four_threads_while_the_reclaim_thread_purges, .timeout = 300) {
    lull_set_purge_delay_ms(0);
    static worker workers[THREADS];
    pthread_t t[THREADS];
    for (int i = 0; i < THREADS; i++) {
        pthread_mutex_init(&queues[i].lock, NULL);
        workers[i].id = i;
        workers[i].rng = 0x13198a2e03707344ULL * (uint64_t)(i + 3);
    }
    for (int i = 0; i < THREADS; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, stress_thread, &workers[i]), 0);
    for (int i = 0; i < THREADS; i++)
        pthread_join(t[i], NULL);
    cr_assert_not(atomic_load(&failed), "%s", fail_msg);
    cr_assert_eq(atomic_load(&total_ops), (unsigned long)THREADS * OPS_PER_THREAD);
    cr_assert(lull_reclaim_now());
}
