/* Thread heaps; see heap.h. A heap is touched only by its owner thread,
 * except remote_spans, the stack other threads push onto when they free into
 * one of its spans. Heaps live in chunks mapped once and are never freed. */
#include "src/heap.h"
#include "src/profile.h"
#include "numa/arena.h"
#include "reclaim/reclaim.h"
#include "src/free_errors.h"
#include "src/outbox.h"
#include "src/reuse.h"
#include "numa/home_arena.h"
#include "base/message.h"
#include "base/prefetch.h"
#include "base/race.h"
#include "base/resident.h"
#include "src/size_class.h"
#include "src/span.h"
#include "src/span_park.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#define HEAP_CHUNK_SIZE ((size_t)1 << 20)

lull_span lull_span_empty;
lull_heap lull_heap_empty = {.direct = {[0 ... LULL_DIRECT_WORDS - 1] = &lull_span_empty},
                             .current = {[0 ... LULL_CLASSES - 1] = &lull_span_empty},
                             .reuse = {[0 ... LULL_CLASSES - 1] = {.used = LULL_REUSE_CLOSED}},
                             .deferred = &lull_heap_empty.deferred_none};
__thread lull_heap *lull_tl_heap __attribute__((tls_model("initial-exec"))) = &lull_heap_empty;

/* reset by a fork child, with the others fork holds (base/fork_exec.h) */
static LULL_FORK_EXEC_DATA pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static lull_heap *all_heaps;
static lull_heap *abandoned[LULL_MAX_NODES];
static uint8_t *chunk_next, *chunk_end;
static pthread_key_t heap_key;
_Atomic uint64_t lull_heap_chunk_bytes;
/* Of those, the bytes handed out as heaps: the rest of a chunk is never
 * touched (the statistics count it purged, the resident estimate not) */
_Atomic uint64_t lull_heap_used_bytes;

/* Set once lull's key destructor has abandoned this thread's heap: what the
 * thread allocates after that (another key's destructor, in a later round
 * than lull's last one) comes from the late heap, so no heap is left
 * behind by a thread whose destructors allocate. */
static __thread bool tl_heap_done __attribute__((tls_model("initial-exec")));

/* One heap for every such late allocation, used under late_lock; its
 * blocks freed later are remote frees, collected like an abandoned heap's. */
static LULL_FORK_EXEC_DATA pthread_mutex_t late_lock = PTHREAD_MUTEX_INITIALIZER;
static lull_heap *late_heap;

/* src/heap.h: held by a thread without a heap between a remote free's CAS
 * and its push of the span (no heap records that span for a fork child) */
static LULL_FORK_EXEC_DATA pthread_mutex_t heapless_lock = PTHREAD_MUTEX_INITIALIZER;

void lull_heapless_remote_free_lock(void) {
    pthread_mutex_lock(&heapless_lock);
}
void lull_heapless_remote_free_unlock(void) {
    pthread_mutex_unlock(&heapless_lock);
}

static void heap_thread_exit(void *arg) {
    lull_heap *h = arg;
    tl_heap_done = true;
    lull_reclaim_no_start = true;
    if (h && h == lull_tl_heap) lull_heap_abandon(h);
}

/* glibc (2.34 and later) blocks every signal but SIGSETXID in a thread
 * whose TSD destructors have run, before it frees its stack (start_thread):
 * SIGCANCEL too (32), which no application's sigprocmask can block, since
 * glibc takes it out of every mask it is given. A thread with no heap that
 * frees there (glibc frees other cached stacks' TLS vectors) got a heap no
 * destructor would abandon: one lost a thread (session 22, 160 threads
 * that never allocated: 108 heaps; tests/test_heap_threads.c). Asked only
 * by a thread with no heap: a system call at its first allocation or free. */
static bool past_thread_destructors(void) {
    uint64_t mask = 0;
    return syscall(SYS_rt_sigprocmask, SIG_BLOCK, NULL, &mask, sizeof mask) == 0 &&
           (mask >> (32 - 1) & 1);
}

bool lull_heap_thread_done(void) {
    if (tl_heap_done) return true;
    if (!past_thread_destructors()) return false;
    /* as heap_thread_exit's: such a thread allocates from the late heap
     * holding late_lock, and a reclaim thread it started there (a start
     * point under the lock, or the heap limit's relief) had
     * pthread_attr_setaffinity_np's calloc take late_lock again: the
     * thread hung (tests/test_late_heap_start.c) */
    lull_reclaim_no_start = true;
    return true;
}

void lull_heaps_init(void) {
    pthread_key_create(&heap_key, heap_thread_exit);
    __atomic_store_n(&lull_reclaim_collect_hook, lull_heaps_collect_abandoned, __ATOMIC_RELEASE);
}

static lull_heap *heap_alloc_locked(void) {
    size_t sz = (sizeof(lull_heap) + 63) & ~(size_t)63;
    if (!chunk_next || chunk_next + sz > chunk_end) {
        void *p =
            mmap(NULL, HEAP_CHUNK_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (p == MAP_FAILED) return NULL;
        atomic_fetch_add_explicit(&lull_heap_chunk_bytes, HEAP_CHUNK_SIZE, memory_order_relaxed);
        chunk_next = p;
        chunk_end = chunk_next + HEAP_CHUNK_SIZE;
    }
    lull_heap *h = (lull_heap *)chunk_next;
    chunk_next += sz;
    atomic_fetch_add_explicit(&lull_heap_used_bytes, sz, memory_order_relaxed);
    /* not checked against the heap limit (base/resident.h): a heap is 28
     * KiB, and every allocation and remote free of a thread needs it */
    lull_resident_add(sz);
    for (unsigned c = 0; c < LULL_CLASSES; c++)
        lull_heap_set_current(h, c, &lull_span_empty);
    lull_reuse_init(h);
    /* the empty slot's mark reads as a free list's last block (next 0) */
    h->deferred_none.next_encoded = lull_link_key(&h->deferred_none);
    lull_heap_deferred_clear(h);
    h->next_all = all_heaps;
    /* release: lull_heap_is_one reads the registry without the lock */
    __atomic_store_n(&all_heaps, h, __ATOMIC_RELEASE);
    return h;
}

lull_heap *lull_heap_late_acquire(void) {
    pthread_mutex_lock(&late_lock);
    if (!late_heap) {
        pthread_mutex_lock(&registry_lock);
        lull_heap *h = heap_alloc_locked();
        pthread_mutex_unlock(&registry_lock);
        if (!h) {
            pthread_mutex_unlock(&late_lock);
            return NULL;
        }
        h->owner_tid = -2; /* nobody's: whoever holds late_lock */
        h->abandoned = true;
        h->node = 0;
        h->arena = &lull_arenas[0];
        /* the reclaim thread looks at it without the lock first */
        __atomic_store_n(&late_heap, h, __ATOMIC_RELEASE);
    }
    return late_heap;
}

void lull_heap_late_release(void) {
    pthread_mutex_unlock(&late_lock);
}

lull_heap *lull_heap_get_or_create(void) {
    if (lull_tl_heap != &lull_heap_empty) return lull_tl_heap;
    int node = lull_home_node();
    pthread_mutex_lock(&registry_lock);
    lull_heap *h = abandoned[node];
    bool adopted = h != NULL;
    if (h) {
        abandoned[node] = h->next_abandoned;
        /* under the lock: a sender that finds it set, holding the lock,
         * owns the heap for that time (lull_heap_collect_if_abandoned) */
        __atomic_store_n(&h->abandoned, false, __ATOMIC_RELAXED);
    } else {
        h = heap_alloc_locked();
    }
    pthread_mutex_unlock(&registry_lock);
    if (!h) {
        errno = ENOMEM;
        return NULL;
    }
    LULL_RACE_POINT(LULL_RACE_ADOPT);
    h->next_abandoned = NULL;
    h->owner_tid = gettid();
    h->node = node;
    h->arena = &lull_arenas[node < lull_arena_count ? node : 0];
    /* a pin is its thread's (lull_thread_set_node pins again after this):
     * an adopted heap kept its former owner's, and its new thread took
     * every span from that node wherever it ran (test_set_node_adopt) */
    h->node_pinned = false;
    if (lull_profile_interval_now() && !h->profile) lull_profile_heap_attach(h);
    lull_tl_heap = h;
    /* after lull_tl_heap is set: if pthread_setspecific allocates, that
     * allocation already finds this heap */
    pthread_setspecific(heap_key, h);
    /* what other threads sent the heap while it was abandoned was the
     * reclaim thread's to collect, and is only this thread's now: one that
     * adopts it by a free and never refills (a consumer, its frees kept on
     * its reuse lists) held those frees for good (test_adopt_inbox) */
    if (adopted) lull_heap_collect_remote(h);
    return h;
}

void lull_heap_queue_remove(lull_span_queue *q, lull_span *span) {
    if (span->prev)
        span->prev->next = span->next;
    else
        q->head = span->next;
    if (span->next)
        span->next->prev = span->prev;
    else
        q->tail = span->prev;
    span->next = span->prev = NULL;
    q->count--;
}

void lull_heap_queue_push_front(lull_span_queue *q, lull_span *span) {
    span->prev = NULL;
    span->next = q->head;
    if (q->head)
        q->head->prev = span;
    else
        q->tail = span;
    q->head = span;
    q->count++;
}

static void update_current(lull_heap *h, unsigned c) {
    lull_heap_set_current(h, c, h->queue[c].head ? h->queue[c].head : &lull_span_empty);
}

/* The block where a list that runs longer than its span can hold turns
 * into a cycle (Floyd's algorithm): the block a second remote free pushed
 * while its first push was still on the list. */
static lull_block *cycle_entry(lull_block *list) {
    lull_block *slow = list, *fast = list;
    do {
        slow = lull_block_next(slow);
        fast = lull_block_next(lull_block_next(fast));
    } while (slow != fast);
    for (slow = list; slow != fast; slow = lull_block_next(slow))
        fast = lull_block_next(fast);
    return slow;
}

/* A remote free of a block that looked free already (remote_suspect): is
 * any block of the remote list on the local free list, or twice on the
 * remote list? The local list is marked in a bitmap of block indexes first,
 * so the check is linear. */
#define SUSPECT_MAX_BLOCKS (LULL_SLICE_SIZE / 8) /* the most a span holds (8-byte class) */

static void check_remote_list(lull_span *span, lull_block *list) {
    if (span->capacity > SUSPECT_MAX_BLOCKS) return;
    uint64_t seen[SUSPECT_MAX_BLOCKS / 64] = {0};
    const uint8_t *start = lull_span_start(span);
    uint32_t limit = span->capacity;
    for (lull_block *f = span->free; f && limit--; f = lull_block_next(f)) {
        size_t i = (size_t)((uint8_t *)f - start) / span->block_size;
        seen[i / 64] |= (uint64_t)1 << (i % 64);
    }
    for (lull_block *r = list; r; r = lull_block_next(r)) {
        size_t i = (size_t)((uint8_t *)r - start) / span->block_size;
        if (seen[i / 64] & ((uint64_t)1 << (i % 64)))
            lull_fatal("free(): double free of %p (freed by its owner thread and by another "
                       "thread)",
                       (void *)r);
        seen[i / 64] |= (uint64_t)1 << (i % 64);
    }
}

/* Splice a remote list taken from the span into its local list. */
static uint32_t span_merge_remote(lull_span *span, lull_block *list) {
    if (!list) return 0;
    LULL_RACE_POINT(LULL_RACE_COLLECT);
    uint32_t n = 1;
    lull_block *tail = list;
    for (lull_block *next; (lull_prefetch_for_write(tail), next = lull_block_next(tail)) != NULL;
         tail = next)
        if (++n > span->capacity) /* without this, a double remote free hangs the owner here */
            lull_fatal_remote_double_free(cycle_entry(list));
    if (atomic_load_explicit(&span->remote_suspect, memory_order_relaxed)) {
        atomic_store_explicit(&span->remote_suspect, 0, memory_order_relaxed);
        check_remote_list(span, list);
    }
    lull_block_set_next(tail, span->free);
    span->free = list;
    lull_span_unuse(span, n);
    if (span->parking) lull_span_park_absorb(span);
    return n;
}

/* The owner's direct collection (a refill, a thread collect or exit, a
 * checked free): takes the list and leaves LULL_REMOTE_QUEUED as it is, so
 * a span whose queueing is still under way is not released under it. */
uint32_t lull_span_collect(lull_span *span) {
    uintptr_t old = atomic_load_explicit(&span->thread_free, memory_order_relaxed);
    do {
        if (!lull_remote_head(old)) return 0;
    } while (!atomic_compare_exchange_weak_explicit(&span->thread_free, &old,
                                                    old & LULL_REMOTE_QUEUED, memory_order_acquire,
                                                    memory_order_relaxed));
    return span_merge_remote(span, lull_remote_head(old));
}

/* The owner popped the span from remote_spans: take the list and clear
 * LULL_REMOTE_QUEUED in one exchange; the next remote free queues it again. */
static uint32_t span_collect_popped(lull_span *span) {
    /* acq_rel: the remote free that sets the bit again pushes the span
     * after our write of remote_next */
    uintptr_t old = atomic_exchange_explicit(&span->thread_free, 0, memory_order_acq_rel);
    return span_merge_remote(span, lull_remote_head(old));
}

/* No block of the span in use, and none on its remote list. */
static bool span_unused(lull_span *span) {
    return lull_span_used(span) == 0 &&
           atomic_load_explicit(&span->thread_free, memory_order_acquire) == 0;
}

/* Released only by its owner, and only when no block is in use and the
 * remote word is 0: then no remote free is pending or half done, and none
 * can come (every block is free). Its parked pages are taken back first;
 * one the reclaim thread is purging at this moment keeps the span until a
 * later visit (a refill, a collection). */
static bool span_releasable(lull_span *span) {
    return span_unused(span) && lull_span_unpark(span, false);
}

/* An empty span the heap keeps is out of the reclaim thread's reach until
 * the thread allocates again, which an idle thread never does: without a
 * bound, one thread kept 29 MiB of empty spans after a 200 MiB burst. So a
 * heap keeps at most LULL_KEPT_SLOTS spans and LULL_KEPT_EMPTY_MAX bytes
 * (whether empty now or not), and a span that empties while there is no
 * room evicts the oldest: the span of a hot malloc/free loop stays, the
 * ones a burst left behind go. */
static void span_release(lull_heap *h, lull_span *span);

static void unkeep(lull_heap *h, lull_span *span) {
    h->kept[span->kept - 1] = NULL;
    h->kept_bytes -= lull_span_bytes(span);
    span->kept = 0;
}

static void evict(lull_heap *h, lull_span *victim) {
    unkeep(h, victim);
    if (!span_releasable(victim)) /* blocks in use, on the full list, or queued */
        return;                   /* in use again: it just stops being kept */
    unsigned c = victim->size_class;
    lull_heap_queue_remove(&h->queue[c], victim);
    update_current(h, c);
    span_release(h, victim);
}

static bool keep_empty(lull_heap *h, lull_span *span) {
    if (span->kept) return true;
    size_t bytes = lull_span_bytes(span);
    if (bytes > LULL_KEPT_EMPTY_MAX) return false;
    /* from the oldest slot on: evict until a free slot and the bytes fit */
    for (unsigned n = 0; n < 2 * LULL_KEPT_SLOTS; n++) {
        lull_span *victim = h->kept[h->kept_next];
        if (victim)
            evict(h, victim); /* its slot is free now */
        else if (h->kept_bytes + bytes <= LULL_KEPT_EMPTY_MAX)
            break;
        else
            h->kept_next = (h->kept_next + 1) % LULL_KEPT_SLOTS;
    }
    if (h->kept[h->kept_next] || h->kept_bytes + bytes > LULL_KEPT_EMPTY_MAX) return false;
    h->kept[h->kept_next] = span;
    span->kept = (uint8_t)(h->kept_next + 1);
    h->kept_next = (h->kept_next + 1) % LULL_KEPT_SLOTS;
    h->kept_bytes += bytes;
    return true;
}

static void span_release(lull_heap *h, lull_span *span) {
    LULL_RACE_POINT(LULL_RACE_SPAN_RELEASE);
    if (span->kept) unkeep(h, span);
    h->spans_returned++;
    lull_arena_free_span(span);
}

/* True if the span went back to its arena. */
static bool span_empty(lull_heap *h, lull_span *span) {
    unsigned c = span->size_class;
    /* a span still on the remote stack is retired when it is popped */
    if (atomic_load_explicit(&span->thread_free, memory_order_acquire) & LULL_REMOTE_QUEUED)
        return false;
    /* keep the only span of a class, within a byte budget: a thread that
     * allocates and frees one block in a loop must not trade slices with the
     * arena every time (180-220 ns a pair for 100-300 KiB blocks, against
     * 9 ns kept) */
    bool keep =
        !h->abandoned && h->queue[c].head == span && span->next == NULL && !lull_span_in_full(span);
    /* its pages come back first (and its blocks onto its list, if it may
     * stay); a page being purged right now leaves the span in its queue,
     * empty, until a later refill */
    if (!lull_span_unpark(span, keep)) {
        __atomic_store_n(&h->purge_wait, true, __ATOMIC_RELAXED);
        return false;
    }
    if (keep && keep_empty(h, span)) return false;
    if (lull_span_in_full(span))
        lull_heap_queue_remove(&h->full, span);
    else
        lull_heap_queue_remove(&h->queue[c], span);
    lull_span_set_in_full(span, false);
    update_current(h, c);
    span_release(h, span);
    return true;
}

void lull_heap_span_empty(lull_heap *h, lull_span *span) {
    /* a span given back wants a deferred reclaim thread (the arena says
     * so); a free never creates it: the next allocation does (reclaim.h) */
    span_empty(h, span);
}

static void unfull(lull_heap *h, lull_span *span) {
    lull_heap_queue_remove(&h->full, span);
    lull_span_set_in_full(span, false);
    lull_heap_queue_push_front(&h->queue[span->size_class], span);
    update_current(h, span->size_class);
}

#define SUSPECTS_TRACKED 8

/* A remote free of a block that looked free already flagged its span
 * (remote_suspect; every remote free does under strict_checks): each block
 * of that span in this inbox is checked against the local free list, where
 * a racing owner's free may have put it. The flag is cleared at the first
 * such block, before the span can be released; the span is remembered so
 * that its other blocks in this inbox are checked too. */
static void check_suspect(lull_span *span, const lull_block *b, lull_span **seen, unsigned *n) {
    bool flagged = atomic_load_explicit(&span->remote_suspect, memory_order_relaxed);
    bool known = false;
    for (unsigned i = 0; i < *n && !known; i++)
        known = seen[i] == span;
    if (!flagged && !known) return;
    if (flagged) {
        atomic_store_explicit(&span->remote_suspect, 0, memory_order_relaxed);
        if (!known && *n < SUSPECTS_TRACKED) seen[(*n)++] = span;
    }
    if (lull_span_free_list_has(span, b))
        lull_fatal("free(): double free of %p (freed by its owner thread and by another thread)",
                   (const void *)b);
}

/* The remote frees other threads sent (outbox.h), applied as local frees:
 * every block of a message is still counted in its span's used, so the
 * span is this heap's until now; a span this empties is kept or released
 * like after any free. */
static void apply_inbox(lull_heap *h) {
    if (!atomic_load_explicit(&h->inbox, memory_order_relaxed)) return;
    lull_block *b = atomic_exchange_explicit(&h->inbox, NULL, memory_order_acquire);
    LULL_RACE_POINT(LULL_RACE_INBOX_APPLY);
    lull_span *suspects[SUSPECTS_TRACKED];
    unsigned suspect_count = 0;
    while (b) {
        /* read, then written: the sender's core wrote it last (prefetch.h) */
        lull_prefetch_for_write(b);
        if (__builtin_expect(!lull_block_in_message(b), 0))
            lull_fatal("free(): block %p was written after another thread freed it", (void *)b);
        lull_block *next = lull_message_next(b);
        lull_span *span = lull_span_of(lull_segment_of(b), b);
        lull_message_prefetch_hints(b, span->block_size); /* the blocks after next */
        check_suspect(span, b, suspects, &suspect_count);
        lull_block_set_next(b, span->free);
        span->free = b;
        if (lull_span_put_back_one(span)) {
            if (span->parking) lull_span_park_absorb(span);
            if (lull_span_in_full(span)) unfull(h, span);
            if (lull_span_used(span) == 0)
                span_empty(h, span);
            else if (span->park_at && !(span->used & ~LULL_SPAN_SLOW_FREE))
                lull_span_park_start(span);
        }
        b = next;
    }
}

void lull_heap_collect_remote(lull_heap *h) {
    apply_inbox(h);
    if (!atomic_load_explicit(&h->remote_spans, memory_order_relaxed)) return;
    lull_span *list = atomic_exchange_explicit(&h->remote_spans, NULL, memory_order_acquire);
    while (list) {
        lull_span *span = list;
        list = span->remote_next;
        span->remote_next = NULL;
        span_collect_popped(span);
        if (lull_span_in_full(span) && lull_span_has_free(span)) unfull(h, span);
        /* span_empty() takes a parking span's pages back itself, threading
         * its blocks if it keeps the span: span_releasable() would stop the
         * parking first, without threading them */
        if (span_unused(span)) span_empty(h, span);
    }
}

/* Every span of the heap: the empty ones go back (one with a page being
 * purged stays, and the heap waits on it), the full ones with a free
 * block leave the full list. */
static void collect_spans(lull_heap *h) {
    bool wait = false;
    for (unsigned c = 0; c < LULL_CLASSES; c++) {
        for (lull_span *s = h->queue[c].head, *next; s; s = next) {
            next = s->next;
            lull_span_collect(s);
            if (span_releasable(s)) {
                lull_heap_queue_remove(&h->queue[c], s);
                span_release(h, s);
            }
        }
        update_current(h, c);
    }
    for (lull_span *s = h->full.head, *next; s; s = next) {
        next = s->next;
        lull_span_collect(s);
        if (span_releasable(s)) {
            lull_heap_queue_remove(&h->full, s);
            lull_span_set_in_full(s, false);
            span_release(h, s);
        } else if (lull_span_has_free(s)) {
            unfull(h, s);
        }
    }
    for (unsigned c = 0; c < LULL_CLASSES && !wait; c++)
        for (lull_span *s = h->queue[c].head; s && !wait; s = s->next)
            wait = lull_span_used(s) == 0 && s->parking;
    /* atomic: the reclaim thread looks at the late heap's without its lock */
    __atomic_store_n(&h->purge_wait, wait, __ATOMIC_RELAXED);
}

void lull_heap_collect(lull_heap *h, bool all) {
    lull_heap_free_deferred(h);   /* its block counts as used in its span */
    if (all) lull_reuse_flush(h); /* kept blocks of other heaps go home */
    lull_outbox_flush(h);
    lull_heap_collect_remote(h);
    if (!all) return;
    lull_profile_heap_flush(h); /* its blocks count as in use in their spans */
    collect_spans(h);
}

void lull_heap_abandon(lull_heap *h) {
    lull_heap_collect(h, true);
    LULL_RACE_POINT(LULL_RACE_ABANDON);
    lull_tl_heap = &lull_heap_empty;
    pthread_mutex_lock(&registry_lock);
    h->owner_tid = 0;
    __atomic_store_n(&h->abandoned, true, __ATOMIC_RELAXED);
    int node = h->node < LULL_MAX_NODES ? h->node : 0;
    h->next_abandoned = abandoned[node];
    abandoned[node] = h;
    pthread_mutex_unlock(&registry_lock);
    /* only the reclaim thread collects the remote frees into an abandoned
     * heap: a deferred one is wanted now, and the next start point (a
     * remote free, say) starts it; never this exiting thread (reclaim.h) */
    lull_reclaim_want();
}

/* The reclaim thread, each tick: the remote frees into heaps whose threads
 * are gone are collected now, not when a new thread adopts the heap (which
 * a process whose thread count fell may never do), and their emptied spans
 * go back to the arena to be purged. Under the registry lock, which no
 * adopting thread gets past meanwhile; the late heap under its own lock. */
static bool remote_frees_waiting(lull_heap *h) {
    return atomic_load_explicit(&h->remote_spans, memory_order_relaxed) ||
           atomic_load_explicit(&h->inbox, memory_order_relaxed);
}

/* An empty span of h stayed, parking, for a page being purged (span_empty):
 * its collection releases it once the purge is done. */
static bool purge_waiting(lull_heap *h) {
    return __atomic_load_n(&h->purge_wait, __ATOMIC_RELAXED);
}

/* The tick's collection of a heap no thread runs on (abandoned, or the late
 * heap under its lock): its remote frees, and its spans when one waits for
 * a purge. */
static void collect_abandoned_one(lull_heap *h) {
    if (!remote_frees_waiting(h) && !purge_waiting(h)) return;
    lull_heap_collect_remote(h);
    if (purge_waiting(h)) collect_spans(h);
}

void lull_heaps_collect_abandoned(void) {
    pthread_mutex_lock(&registry_lock);
    for (int node = 0; node < LULL_MAX_NODES; node++)
        for (lull_heap *h = abandoned[node]; h; h = h->next_abandoned)
            collect_abandoned_one(h);
    pthread_mutex_unlock(&registry_lock);
    lull_heap *late = __atomic_load_n(&late_heap, __ATOMIC_ACQUIRE);
    if (late && (remote_frees_waiting(late) || purge_waiting(late))) {
        pthread_mutex_lock(&late_lock);
        collect_abandoned_one(late);
        pthread_mutex_unlock(&late_lock);
    }
}

void lull_heap_collect_if_abandoned(lull_heap *h) {
    if (!__atomic_load_n(&h->abandoned, __ATOMIC_RELAXED) ||
        h == __atomic_load_n(&late_heap, __ATOMIC_ACQUIRE))
        return;
    /* busy: the reclaim thread collecting every abandoned heap, or a thread
     * adopting one or making its heap; the next reclaim tick collects */
    if (pthread_mutex_trylock(&registry_lock) != 0) return;
    if (h->abandoned) lull_heap_collect_remote(h); /* still on an abandoned list */
    pthread_mutex_unlock(&registry_lock);
}

bool lull_heap_is_one(const lull_heap *h) {
    for (const lull_heap *k = __atomic_load_n(&all_heaps, __ATOMIC_ACQUIRE); k; k = k->next_all)
        if (k == h) return true;
    return false;
}

void lull_heaps_foreach(void (*fn)(lull_heap *h, void *arg), void *arg) {
    pthread_mutex_lock(&registry_lock);
    for (lull_heap *h = all_heaps; h; h = h->next_all)
        fn(h, arg);
    pthread_mutex_unlock(&registry_lock);
}

void lull_heaps_fork_prepare(void) {
    pthread_mutex_lock(&late_lock);
    pthread_mutex_lock(&registry_lock);
    pthread_mutex_lock(&heapless_lock);
}
void lull_heaps_fork_parent(void) {
    pthread_mutex_unlock(&heapless_lock);
    pthread_mutex_unlock(&registry_lock);
    pthread_mutex_unlock(&late_lock);
}

LULL_FORK_EXEC_TEXT static bool on_remote_spans(const lull_heap *owner, const lull_span *span) {
    for (lull_span *s = atomic_load_explicit(&owner->remote_spans, memory_order_relaxed); s;
         s = s->remote_next)
        if (s == span) return true;
    return false;
}

/* A remote free copied between its CAS, which set LULL_REMOTE_QUEUED, and
 * its push of the span (src/alloc.c's remote_free) left the span queued on
 * no list: its owner would collect its blocks for ever and never release
 * it. Its thread's heap names the span (remote_queuing): pushed here, once
 * (two threads' records may name one span). A record whose free had not
 * set the bit, or had pushed already, finds the bit clear or the span
 * listed. Reads only, unless a record is set (no page of a heap copied). */
LULL_FORK_EXEC_TEXT static void push_half_queued_spans(void) {
    for (lull_heap *h = all_heaps; h; h = h->next_all) {
        lull_span *span = atomic_load_explicit(&h->remote_queuing, memory_order_relaxed);
        if (!span) continue;
        atomic_store_explicit(&h->remote_queuing, NULL, memory_order_relaxed);
        lull_heap *owner = atomic_load_explicit(&span->heap, memory_order_relaxed);
        uintptr_t word = atomic_load_explicit(&span->thread_free, memory_order_relaxed);
        if (!owner || !(word & LULL_REMOTE_QUEUED) || on_remote_spans(owner, span)) continue;
        span->remote_next = atomic_load_explicit(&owner->remote_spans, memory_order_relaxed);
        atomic_store_explicit(&owner->remote_spans, span, memory_order_relaxed);
    }
}

/* The other threads' heaps may have been mid-update when fork copied
 * them: they are never adopted in the child (they are on no abandoned
 * list; their blocks stay allocated there, and most children exec soon).
 * The abandoned heaps were consistent. No heap is written here: each
 * heap's owner_tid stays the parent's (a write would copy a page of every
 * heap in every child, and a gettid() call, 2 of a child's page faults). */
LULL_FORK_EXEC_TEXT void lull_heaps_fork_child(void) {
    lull_mutex_reset_in_child(&heapless_lock);
    lull_mutex_reset_in_child(&registry_lock);
    lull_mutex_reset_in_child(&late_lock);
    push_half_queued_spans();
}
