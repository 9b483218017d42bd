/* The queue of freed huge mappings; see huge_queue.h.
 *
 * States of a slot word (the word format of reclaim/huge_word.h: header
 * address, node, block size in pages, state bits DIRTY):
 *
 *   EMPTY  (0)     no mapping
 *   QUEUED (word)  a freed mapping, not purged, accounted as `freed`,
 *                  owned by nobody: nobody reads or writes its header
 *
 * Transitions, each one compare-and-swap on the word; the thread whose CAS
 * succeeds owns the mapping from then on, any other CAS on that word fails:
 *
 *   push    free(), any thread, owning h:   EMPTY  -> QUEUED
 *   take    huge malloc, any thread:        QUEUED -> EMPTY  (the word fits;
 *                                           huge_queue.h for which ones)
 *   claim   the reclaim thread, oldest      QUEUED -> EMPTY  (then it caches
 *           first, each tick:                         the mapping, or purges
 *                                                     and unmaps it)
 *   take_all  huge malloc, no reclaim       QUEUED -> EMPTY  for every slot,
 *             thread running                          then EMPTY -> QUEUED
 *             (take_first_fit):                       (a push) for each
 *                                                     one it does not keep
 *
 * The overflow stack: push (free) one CAS on the head; take whole (the
 * reclaim thread, take_first_fit, an aligned malloc) one exchange to NULL;
 * give back (the aligned malloc, what it did not keep) one CAS from NULL,
 * (take_first_fit) a push of each.
 *
 * So a malloc never gets a mapping the reclaim thread is purging or
 * unmapping (the reclaim thread purges only what its claim won), and the
 * reclaim thread never unmaps one a malloc took. The word alone tells the
 * fit; a header is read only by its owner. A word read, then taken, reused
 * and pushed again into the same slot by others is the same word: a claim
 * with the stale copy wins the mapping as it is now, queued and free, which
 * is right; only its age (seq) was newer than read, and age is policy.
 *
 * The overflow stack takes what no slot can: a mapping no word can name
 * (an over-aligned block, a header above 2^49) or one freed while every
 * slot is taken. Push is one CAS on its head; it is only ever taken whole
 * (an exchange: no ABA), so whoever walks it owns every header on it: the
 * reclaim thread each tick, take_first_fit, and a huge malloc aligned past
 * a slice (take_aligned), which looks at the first
 * LULL_HUGE_QUEUE_ALIGNED_LOOKS, keeps the tightest fit and gives the rest
 * back in one CAS (after what was pushed meanwhile). Without it, a loop of
 * aligned_alloc(1 GiB, 100) and free() mapped a new block each time while
 * the freed ones waited here: 2-10 TiB of address space at its peak.
 *
 * queued_bytes (what the backlog rule reads): each mapping's map_len,
 * added by its pusher before it goes in and subtracted by its owner after
 * it came out, so it is never below what is queued.
 *
 * Fork: the reclaim thread's claims are inside its huge step (which
 * fork's prepare handler waits for), so a child never inherits a mapping
 * the reclaim thread held between its claim and its unmap. An aligned
 * take holds the whole overflow, and take_first_fit the whole queue, under
 * taken_whole_lock, which the prepare handler takes too (before session
 * 27 a child copied inside an aligned take lost every mapping on the
 * overflow, before session 28 one copied inside take_first_fit every
 * queued mapping: race_fork_huge::). A malloc's take of a
 * slot in flight on another thread leaves the child one mapping nobody
 * holds (counted as `freed`, its address space lost to that child only);
 * the child counts queued_bytes again. */
#include "reclaim/huge_queue.h"
#include "reclaim/huge_word.h"
#include "base/fork_exec.h"
#include "base/race.h"

#include <pthread.h>
#include <stdatomic.h>

static _Atomic uint64_t slots[LULL_HUGE_QUEUE_SLOTS];
/* Push order of each slot's entry: written by the pusher before it fills
 * the slot (a racing pusher of the same empty slot may write too: the
 * order is then a little later than the entry's, never earlier). */
static _Atomic uint32_t slot_seq[LULL_HUGE_QUEUE_SLOTS];
static _Atomic uint32_t next_seq;
static lull_huge *_Atomic overflow;
static LULL_FORK_EXEC_DATA _Atomic uint64_t queued_bytes; /* 0: nothing queued */

static void bytes_add(uint64_t v) {
    atomic_fetch_add_explicit(&queued_bytes, v, memory_order_relaxed);
}

static void bytes_sub(uint64_t v) {
    atomic_fetch_sub_explicit(&queued_bytes, v, memory_order_relaxed);
}

static void overflow_push(lull_huge *h) {
    lull_huge *old = atomic_load_explicit(&overflow, memory_order_relaxed);
    do {
        h->next = old;
    } while (!atomic_compare_exchange_weak_explicit(&overflow, &old, h, memory_order_release,
                                                    memory_order_relaxed));
}

void lull_huge_queue_push(lull_huge *h) {
    bytes_add(h->map_len);
    if (lull_huge_word_accepts(h)) {
        uint64_t w = lull_huge_word(h, LULL_HC_DIRTY);
        uint32_t seq = atomic_fetch_add_explicit(&next_seq, 1, memory_order_relaxed);
        for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++) {
            uint64_t expected = atomic_load_explicit(&slots[i], memory_order_relaxed);
            if (expected) continue;
            atomic_store_explicit(&slot_seq[i], seq, memory_order_relaxed);
            /* release: the header's last writes (the free) before the take's reads */
            if (atomic_compare_exchange_strong_explicit(&slots[i], &expected, w,
                                                        memory_order_release, memory_order_relaxed))
                return;
        }
    }
    overflow_push(h);
}

uint64_t lull_huge_queue_bytes(void) {
    return atomic_load_explicit(&queued_bytes, memory_order_relaxed);
}

static void decode(uint64_t w, unsigned i, lull_huge_queue_entry *e) {
    lull_huge_cache_entry c;
    lull_huge_word_decode(w, &c);
    e->word = w;
    e->h = c.h;
    e->usable = c.usable;
    e->node = c.node;
    e->slot = i;
}

/* Own the mapping in slot e->slot if the slot still holds e's word. */
static bool take_slot(const lull_huge_queue_entry *e) {
    uint64_t expected = e->word;
    if (!atomic_compare_exchange_strong_explicit(&slots[e->slot], &expected, 0,
                                                 memory_order_acquire, memory_order_relaxed))
        return false;
    bytes_sub(e->h->map_len); /* ours now: its header may be read */
    return true;
}

lull_huge *lull_huge_queue_take(size_t size, int node, uint64_t keep_bound) {
    uint64_t queued = lull_huge_queue_bytes();
    if (!queued) return NULL;
    bool backlog = queued > LULL_HUGE_QUEUE_BACKLOG;
    /* a lost race means another thread took that entry: look again, a few
     * times, for the next best */
    for (int attempt = 0; attempt < 4; attempt++) {
        lull_huge_queue_entry best = {0}, e;
        for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++) {
            uint64_t w = atomic_load_explicit(&slots[i], memory_order_relaxed);
            if (!w) continue;
            decode(w, i, &e);
            if (e.node != node || !lull_huge_fits(e.usable, size)) continue;
            if (!backlog && e.usable + LULL_SLICE_SIZE > keep_bound) continue;
            if (!best.word || e.usable < best.usable) best = e; /* the tightest fit */
        }
        if (!best.word) return NULL;
        if (take_slot(&best)) return best.h;
    }
    return NULL;
}

bool lull_huge_queue_peek(unsigned i, lull_huge_queue_entry *e) {
    uint64_t w = atomic_load_explicit(&slots[i], memory_order_acquire);
    if (!w) return false;
    decode(w, i, e);
    e->seq = atomic_load_explicit(&slot_seq[i], memory_order_relaxed);
    return true;
}

bool lull_huge_queue_claim(const lull_huge_queue_entry *e) {
    return take_slot(e);
}

lull_huge *lull_huge_queue_take_overflow(void) {
    if (!atomic_load_explicit(&overflow, memory_order_relaxed)) return NULL;
    lull_huge *list = atomic_exchange_explicit(&overflow, NULL, memory_order_acquire);
    for (lull_huge *h = list; h; h = h->next)
        bytes_sub(h->map_len);
    return list;
}

/* Give a list taken from the overflow back (linked by `next`, ending
 * NULL): onto an empty stack in one CAS, else with what was pushed since in
 * front of it (taken whole again, and walked: only the pushes made while
 * this thread held the list). The stack's order, newest first, stays. */
static void overflow_give_back(lull_huge *list) {
    while (list) {
        lull_huge *expected = NULL;
        if (atomic_compare_exchange_strong_explicit(&overflow, &expected, list,
                                                    memory_order_release, memory_order_relaxed))
            return;
        lull_huge *newer = atomic_exchange_explicit(&overflow, NULL, memory_order_acquire);
        if (!newer) continue;
        lull_huge *tail = newer;
        while (tail->next)
            tail = tail->next;
        tail->next = list;
        list = newer;
    }
}

/* Held while a huge malloc holds mappings it took from the queue whole,
 * from the take to the give back: an aligned take's overflow
 * (take_aligned), or, with no reclaim thread, every queued mapping
 * (take_first_fit); and by fork's prepare handler: a child copied in
 * between had none of the mappings the taking thread held (their address
 * space never unmapped there). */
static LULL_FORK_EXEC_DATA pthread_mutex_t taken_whole_lock = PTHREAD_MUTEX_INITIALIZER;

void lull_huge_queue_fork_prepare(void) {
    pthread_mutex_lock(&taken_whole_lock);
}
void lull_huge_queue_fork_parent(void) {
    pthread_mutex_unlock(&taken_whole_lock);
}
LULL_FORK_EXEC_TEXT void lull_huge_queue_fork_child(void) {
    lull_mutex_reset_in_child(&taken_whole_lock);
}

lull_huge *lull_huge_queue_take_aligned(size_t size, size_t alignment, int node) {
    if (!atomic_load_explicit(&overflow, memory_order_relaxed)) return NULL;
    pthread_mutex_lock(&taken_whole_lock);
    /* taken whole (no ABA), so every header below is this thread's to read */
    lull_huge *list = atomic_exchange_explicit(&overflow, NULL, memory_order_acquire);
    lull_huge *best = NULL, *rest = NULL, **rest_end = &rest;
    unsigned looked = 0;
    while (list && looked++ < LULL_HUGE_QUEUE_ALIGNED_LOOKS) {
        lull_huge *h = list;
        list = h->next;
        bool fits = lull_huge_node_of(h) == node &&
                    ((uintptr_t)h + h->block_offset) % alignment == 0 &&
                    lull_huge_fits(h->usable, size);
        if (fits && (!best || h->usable < best->usable)) { /* the tightest fit */
            lull_huge *swap = best;
            best = h;
            h = swap;
        }
        if (!h) continue;
        *rest_end = h; /* in the order taken */
        rest_end = &h->next;
    }
    *rest_end = list; /* and what was not looked at, after them */
    LULL_RACE_POINT(LULL_RACE_HUGE_TAKE_ALIGNED);
    overflow_give_back(rest);
    pthread_mutex_unlock(&taken_whole_lock);
    if (best) bytes_sub(best->map_len); /* ours now */
    return best;
}

/* Every queued mapping, slots and overflow, linked by `next`. */
static lull_huge *take_all(void) {
    lull_huge *list = lull_huge_queue_take_overflow();
    lull_huge_queue_entry e;
    for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++)
        if (lull_huge_queue_peek(i, &e) && take_slot(&e)) {
            e.h->next = list;
            list = e.h;
        }
    return list;
}

lull_huge *lull_huge_queue_take_first_fit(size_t size, int node) {
    if (!lull_huge_queue_bytes()) return NULL; /* never below what is queued */
    pthread_mutex_lock(&taken_whole_lock);
    lull_huge *list = take_all(), *found = NULL;
    LULL_RACE_POINT(LULL_RACE_HUGE_TAKE_ALL);
    while (list) {
        lull_huge *h = list;
        list = h->next;
        /* the block's room is `usable`, as the words have it: a fallback
         * mapping's slack after the block is not the block's */
        if (!found && h->block_offset == LULL_SLICE_SIZE && lull_huge_node_of(h) == node &&
            lull_huge_fits(h->usable, size))
            found = h; /* taken: its bytes are off the count */
        else
            lull_huge_queue_push(h);
    }
    pthread_mutex_unlock(&taken_whole_lock);
    return found;
}

LULL_FORK_EXEC_TEXT void lull_huge_queue_after_fork_child(void) {
    /* never below what is queued: 0, and the child reads no slot */
    if (!atomic_load_explicit(&queued_bytes, memory_order_relaxed)) return;
    uint64_t bytes = 0; /* one thread here: nobody takes or unmaps meanwhile */
    lull_huge_queue_entry e;
    for (unsigned i = 0; i < LULL_HUGE_QUEUE_SLOTS; i++)
        if (lull_huge_queue_peek(i, &e)) bytes += e.h->map_len;
    for (lull_huge *h = atomic_load_explicit(&overflow, memory_order_relaxed); h; h = h->next)
        bytes += h->map_len;
    atomic_store_explicit(&queued_bytes, bytes, memory_order_relaxed);
}
