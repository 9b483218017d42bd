/* Defragmentation (src/defrag.c): lull_defrag_query() and
 * lull_defrag_move().
 *
 * Checked here: bad inputs (NULL, a NULL array, stack, static and mmap
 * memory, a pointer inside a block, a freed block whose span lives on, a
 * freed block whose span went back, freed large and huge blocks) give -1
 * with EINVAL and never abort, and a move of them returns them untouched;
 * the figures of the caller's own heap are exact (span and class, over the
 * non-full spans); a block of a sparse span moves into the densest span,
 * contents intact, its old block freed; a block of the current span, of
 * the densest span, of a full span, and a large or huge block stay; a
 * sparse span emptied by moves goes back; a block of another thread's heap
 * moves into the caller's, and its old block reaches its owner; a table of
 * blocks freed at random takes fewer spans after a defrag loop, every
 * block's contents intact.
 *
 * Every heap whose figures are checked is a new thread's (each test is a
 * process of its own, so the thread's heap is new: no other thread exited
 * before it), and every wait is on an event (a barrier or a join). */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/deferred_free.h"
#include "src/heap.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

/* 1664 bytes: a class the test runner itself does not use */
#define SIZE ((size_t)1664)

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

/* Every word of a block from a tag that travels with it (not from its
 * address: a moved block keeps its contents). */
static void fill(void *p, size_t size, uint64_t tag) {
    uint64_t *w = p;
    for (size_t i = 0; i < size / 8; i++)
        w[i] = mix(tag * 1000003 + i);
}

static bool intact(const void *p, size_t size, uint64_t tag) {
    const uint64_t *w = p;
    for (size_t i = 0; i < size / 8; i++)
        if (w[i] != mix(tag * 1000003 + i)) return false;
    return true;
}

static lull_span *span_of(const void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

static int query1(const void *p, lull_defrag_info *info) {
    return lull_defrag_query(&p, 1, info);
}

/* Run fn in a new thread (a new heap) and wait for it. */
static void in_thread(void *(*fn)(void *), void *arg) {
    /* the reclaim thread first, which allocates as it starts: then no other
     * thread takes the spans that a test sees go back */
    lull_reclaim_now();
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, fn, arg), 0);
    cr_assert_eq(pthread_join(t, NULL), 0);
}

/* ---- three spans of one class ------------------------------------------ */

/* Spans a (10 % in use), b (90 %) and c (50 %, the current one) of the
 * class of SIZE in the calling thread's heap, their blocks filled with
 * their index as tag; live[i] says whether block i is still in use. */
typedef struct {
    unsigned cap;
    void **blocks; /* 3 x cap */
    bool *live;
    lull_span *a, *b, *c;
} three_spans;

static bool keep_in(unsigned i, unsigned percent) {
    return (i * 37 % 100) < percent; /* spread over the span */
}

static void three_spans_make(three_spans *t) {
    unsigned cls = lull_class_of(SIZE);
    t->cap = lull_classes[cls].capacity;
    t->blocks = mmap(NULL, 3 * t->cap * sizeof(void *), PROT_READ | PROT_WRITE,
                     MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    t->live = mmap(NULL, 3 * t->cap, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i < 3 * t->cap; i++) {
        t->blocks[i] = lull_malloc(SIZE);
        cr_assert_not_null(t->blocks[i]);
        fill(t->blocks[i], SIZE, i);
        t->live[i] = true;
    }
    t->a = span_of(t->blocks[0]);
    t->b = span_of(t->blocks[t->cap]);
    t->c = span_of(t->blocks[2 * t->cap]);
    cr_assert(t->a != t->b && t->b != t->c && t->a != t->c, "one span per capacity of blocks");
    cr_assert_eq(span_of(t->blocks[t->cap - 1]), t->a);
    /* c first: it is current and stays so (the others come back from the
     * full list into the queue behind it) */
    static const unsigned keep[3] = {10, 90, 50};
    for (unsigned s = 3; s-- > 0;)
        for (unsigned k = 0; k < t->cap; k++) {
            unsigned i = s * t->cap + k;
            if (keep_in(k, keep[s])) continue;
            lull_free(t->blocks[i]);
            t->live[i] = false;
        }
    lull_heap *h = lull_tl_heap;
    cr_assert_eq(h->current[cls], t->c, "the half-full span is current");
}

static uint32_t live_in(const three_spans *t, unsigned s) {
    uint32_t n = 0;
    for (unsigned k = 0; k < t->cap; k++)
        n += t->live[s * t->cap + k];
    return n;
}

static unsigned first_live(const three_spans *t, unsigned s) {
    for (unsigned k = 0; k < t->cap; k++)
        if (t->live[s * t->cap + k]) return s * t->cap + k;
    cr_assert_fail("span %u has a live block", s);
    return 0;
}

/* ---- bad inputs ---------------------------------------------------------- */

static char static_bytes[4096];

static void expect_invalid(const void *p, const char *what) {
    lull_defrag_info info;
    memset(&info, 0xab, sizeof info);
    errno = 0;
    cr_assert_eq(query1(p, &info), -1, "%s: query fails", what);
    cr_assert_eq(errno, EINVAL, "%s: EINVAL", what);
    cr_assert_eq(info.block_size, 0, "%s: its entry is zero", what);
    cr_assert_eq(info.span_total, 0, "%s: its entry is zero", what);
    cr_assert_eq(info.moved_would_help, 0, "%s", what);
    errno = 0;
    cr_assert_eq(lull_defrag_move((void *)p), p, "%s: move returns it", what);
    if (p) cr_assert_eq(errno, EINVAL, "%s: move sets EINVAL", what);
}

Test(defrag, bad_inputs_fail_with_einval_and_never_abort) {
    void *warm = lull_malloc(64); /* lull is started */
    int on_stack = 0;
    char *mapped = mmap(NULL, 1 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    cr_assert_neq(mapped, MAP_FAILED);
    expect_invalid(NULL, "NULL");
    expect_invalid(&on_stack, "stack");
    expect_invalid(static_bytes, "static");
    expect_invalid(mapped, "mmap");
    expect_invalid(mapped + 4096, "mmap + 4096");
    expect_invalid((char *)warm + 8, "inside a block");
    lull_defrag_info info;
    errno = 0;
    cr_assert_eq(lull_defrag_query(NULL, 1, &info), -1);
    cr_assert_eq(errno, EINVAL);
    const void *one = warm;
    cr_assert_eq(lull_defrag_query(&one, 1, NULL), -1);
    cr_assert_eq(lull_defrag_query(NULL, 0, NULL), 0, "nothing to do");
    /* one bad pointer among good ones: the good ones are filled */
    const void *mixed[3] = {warm, &on_stack, warm};
    lull_defrag_info out[3];
    cr_assert_eq(lull_defrag_query(mixed, 3, out), -1);
    cr_assert_eq(out[0].block_size, 64);
    cr_assert_eq(out[1].block_size, 0);
    cr_assert_eq(out[2].block_size, 64);
    cr_assert_eq(out[0].owned_by_caller, 1);
    munmap(mapped, 1 << 20);
    lull_free(warm);
}

static void *freed_blocks(void *arg) {
    (void)arg;
    /* a freed block whose span lives on (a neighbour holds it) */
    void *keep = lull_malloc(SIZE);
    void *gone = lull_malloc(SIZE);
    cr_assert_eq(span_of(keep), span_of(gone));
    lull_free(gone);
    expect_invalid(gone, "freed, span in use");
    lull_defrag_info info;
    cr_assert_eq(query1(keep, &info), 0, "its neighbour is fine");
    /* a freed block whose span went back: make the class's current span
     * another one, then empty the first */
    unsigned cap = lull_classes[lull_class_of(SIZE)].capacity;
    void **more = mmap(NULL, cap * sizeof(void *), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i < cap; i++)
        more[i] = lull_malloc(SIZE);
    lull_span *first = span_of(keep);
    for (unsigned i = 0; i < cap; i++)
        if (span_of(more[i]) == first) {
            lull_free(more[i]);
            more[i] = NULL;
        }
    lull_free(keep);
    complete_last_free();
    /* (a span that went back may be taken again at once, by another heap:
     * the reclaim thread started before, so nothing else takes spans here) */
    cr_assert_eq(lull_span_of(lull_segment_of(keep), keep),
                 lull_span_table_of(lull_segment_of(keep))->slices, "the emptied span went back");
    expect_invalid(keep, "freed, span gone");
    for (unsigned i = 0; i < cap; i++)
        lull_free(more[i]);
    /* large and huge blocks, freed */
    void *large = lull_malloc(1 << 20);
    void *huge = lull_malloc(40 << 20);
    cr_assert_not_null(huge);
    lull_free(large);
    lull_free(huge);
    expect_invalid(large, "freed large");
    expect_invalid(huge, "freed huge");
    return NULL;
}

Test(defrag, freed_blocks_fail_with_einval) {
    in_thread(freed_blocks, NULL);
}

/* ---- the figures and the moves in one heap ------------------------------ */

static void *figures(void *arg) {
    (void)arg;
    three_spans t;
    three_spans_make(&t);
    uint32_t la = live_in(&t, 0), lb = live_in(&t, 1), lc = live_in(&t, 2);
    cr_assert(la < lc && lc < lb);
    const void *p[3] = {t.blocks[first_live(&t, 0)], t.blocks[first_live(&t, 1)],
                        t.blocks[first_live(&t, 2)]};
    lull_defrag_info info[3];
    cr_assert_eq(lull_defrag_query(p, 3, info), 0);
    uint32_t live[3] = {la, lb, lc};
    for (int s = 0; s < 3; s++) {
        cr_assert_eq(info[s].owned_by_caller, 1);
        cr_assert_eq(info[s].block_size, SIZE);
        cr_assert_eq(info[s].span_total, t.cap, "span %d", s);
        cr_assert_eq(info[s].span_free, t.cap - live[s], "span %d", s);
        cr_assert_eq(info[s].class_total, 3 * t.cap, "span %d: three non-full spans", s);
        cr_assert_eq(info[s].class_free, 3 * t.cap - la - lb - lc, "span %d", s);
    }
    cr_assert_eq(info[0].moved_would_help, 1, "the sparse span's block would move");
    cr_assert_eq(info[1].moved_would_help, 0, "the densest span's would not");
    cr_assert_eq(info[2].moved_would_help, 0, "the current span's would not");
    return NULL;
}

Test(defrag, query_gives_exact_figures_of_the_callers_heap) {
    in_thread(figures, NULL);
}

static void *moves(void *arg) {
    (void)arg;
    three_spans t;
    three_spans_make(&t);
    uint32_t la = live_in(&t, 0), lb = live_in(&t, 1);
    /* the densest and the current span's blocks stay */
    unsigned ib = first_live(&t, 1), ic = first_live(&t, 2);
    cr_assert_eq(lull_defrag_move(t.blocks[ib]), t.blocks[ib], "densest: stays");
    cr_assert_eq(lull_defrag_move(t.blocks[ic]), t.blocks[ic], "current: stays");
    /* the sparse span's block moves into the densest */
    unsigned ia = first_live(&t, 0);
    void *old = t.blocks[ia];
    void *moved = lull_defrag_move(old);
    cr_assert_neq(moved, old, "the sparse span's block moves");
    cr_assert_eq(span_of(moved), t.b, "into the densest span");
    cr_assert(intact(moved, SIZE, ia), "with its contents");
    cr_assert_eq(lull_span_used(t.a), la - 1, "the old block is freed");
    cr_assert_eq(lull_span_used(t.b), lb + 1);
    expect_invalid(old, "the old block");
    t.blocks[ia] = moved;
    /* the class's figures did not change (one block moved within it) */
    lull_defrag_info info;
    cr_assert_eq(query1(moved, &info), 0);
    cr_assert_eq(info.class_total, 3 * t.cap);
    /* move the rest of a: a empties and goes back */
    for (unsigned k = 0; k < t.cap; k++) {
        unsigned i = k;
        if (!t.live[i] || i == ia) continue;
        void *q = lull_defrag_move(t.blocks[i]);
        cr_assert_neq(q, t.blocks[i], "block %u moves", i);
        cr_assert(intact(q, SIZE, i));
        t.blocks[i] = q;
    }
    cr_assert_neq(atomic_load(&t.a->heap), lull_tl_heap, "the emptied sparse span went back");
    cr_assert_eq(query1(moved, &info), 0);
    unsigned non_full = (lull_span_used(t.b) < t.cap) + (lull_span_used(t.c) < t.cap);
    cr_assert_eq(info.class_total, non_full * t.cap, "a is no longer in the class (b may be full)");
    for (unsigned i = 0; i < 3 * t.cap; i++)
        if (t.live[i]) {
            cr_assert(intact(t.blocks[i], SIZE, i), "block %u", i);
            lull_free(t.blocks[i]);
        }
    return NULL;
}

Test(defrag, sparse_blocks_move_into_the_densest_span) {
    in_thread(moves, NULL);
}

static void *full_and_large(void *arg) {
    (void)arg;
    unsigned cap = lull_classes[lull_class_of(SIZE)].capacity;
    void **b = mmap(NULL, 2 * cap * sizeof(void *), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i < 2 * cap; i++)
        b[i] = lull_malloc(SIZE);
    /* the first span is full (on the full list), the second current */
    lull_defrag_info info;
    cr_assert_eq(query1(b[0], &info), 0);
    cr_assert_eq(info.span_free, 0);
    cr_assert_eq(info.moved_would_help, 0);
    cr_assert_eq(lull_defrag_move(b[0]), b[0], "a full span's block stays");
    /* the only span with room is current: nowhere to go */
    lull_free(b[cap]);
    cr_assert_eq(lull_defrag_move(b[cap + 1]), b[cap + 1]);
    void *large = lull_malloc(1 << 20), *huge = lull_malloc(40 << 20);
    cr_assert_eq(query1(large, &info), 0);
    cr_assert_eq(info.span_total, 1);
    cr_assert_eq(info.span_free, 0);
    cr_assert_geq(info.block_size, 1 << 20);
    cr_assert_eq(info.moved_would_help, 0);
    cr_assert_eq(lull_defrag_move(large), large, "a large block stays");
    cr_assert_eq(query1(huge, &info), 0);
    cr_assert_geq(info.block_size, 40 << 20);
    cr_assert_eq(lull_defrag_move(huge), huge, "a huge block stays");
    lull_free(large);
    lull_free(huge);
    for (unsigned i = 0; i < 2 * cap; i++)
        if (i != cap) lull_free(b[i]);
    return NULL;
}

Test(defrag, full_current_large_and_huge_blocks_stay) {
    in_thread(full_and_large, NULL);
}

/* ---- another thread's block ---------------------------------------------- */

/* The owner makes a sparse span that is not its current one, hands over a
 * block of it, and waits while the mover (with a dense span of the class
 * in its own heap) moves it; then it collects and checks that the old
 * block came back to it. */
typedef struct {
    pthread_barrier_t handed, moved, sent;
    void *block;
    uint64_t tag;
    lull_span *span;
    uint32_t used_before;
} handover;

static void *owner_thread(void *arg) {
    handover *h = arg;
    unsigned cap = lull_classes[lull_class_of(SIZE)].capacity;
    void **b = mmap(NULL, (cap + 1) * sizeof(void *), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i <= cap; i++)
        b[i] = lull_malloc(SIZE);
    /* b[cap] is in the current span; the first span keeps 1 block in 10 */
    for (unsigned i = 0; i < cap; i++)
        if (i % 10) lull_free(b[i]);
    complete_last_free();
    h->block = b[0];
    h->tag = 77;
    fill(b[0], SIZE, h->tag);
    h->span = span_of(b[0]);
    h->used_before = lull_span_used(h->span);
    pthread_barrier_wait(&h->handed);
    pthread_barrier_wait(&h->moved);
    pthread_barrier_wait(&h->sent); /* the mover's outbox went out */
    lull_thread_collect();
    cr_assert_eq(lull_span_used(h->span), h->used_before - 1, "the old block came back");
    lull_defrag_info info;
    cr_assert_eq(query1(b[0], &info), -1, "and is free");
    for (unsigned i = 10; i <= cap; i += 10)
        lull_free(b[i]);
    lull_free(b[cap]);
    return NULL;
}

Test(defrag, a_block_of_another_heap_moves_into_the_callers) {
    handover h;
    pthread_barrier_init(&h.handed, NULL, 2);
    pthread_barrier_init(&h.moved, NULL, 2);
    pthread_barrier_init(&h.sent, NULL, 2);
    /* the mover's own dense span: 9 blocks in 10 in use, not current (its
     * first allocation starts lull, which fills the class table) */
    void *first = lull_malloc(SIZE);
    unsigned cap = lull_classes[lull_class_of(SIZE)].capacity;
    lull_free(first);
    void **mine = mmap(NULL, (cap + 1) * sizeof(void *), PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i <= cap; i++)
        mine[i] = lull_malloc(SIZE);
    for (unsigned i = 0; i < cap; i += 10) {
        lull_free(mine[i]);
        mine[i] = NULL;
    }
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, owner_thread, &h), 0);
    pthread_barrier_wait(&h.handed);
    lull_defrag_info info;
    cr_assert_eq(query1(h.block, &info), 0);
    cr_assert_eq(info.owned_by_caller, 0, "another heap's block");
    cr_assert_eq(info.span_total, cap);
    cr_assert_eq(info.span_free, cap - h.used_before);
    cr_assert_eq(info.class_total, 0, "no walk of another heap's lists");
    cr_assert_eq(info.moved_would_help, 1);
    void *q = lull_defrag_move(h.block);
    cr_assert_neq(q, h.block);
    cr_assert_eq(span_of(q), span_of(mine[1]), "into the caller's dense span");
    cr_assert(intact(q, SIZE, h.tag));
    /* the old block goes home, not onto the mover's reuse list
     * (src/reuse.h), from which its next malloc would take it back into
     * the sparse span */
    cr_assert_null(lull_tl_heap->reuse[lull_class_of(SIZE)].free, "the mover kept the old block");
    pthread_barrier_wait(&h.moved);
    lull_thread_collect(); /* sends the remote free */
    pthread_barrier_wait(&h.sent);
    cr_assert_eq(pthread_join(t, NULL), 0);
    lull_free(q);
    for (unsigned i = 0; i <= cap; i++)
        lull_free(mine[i]);
}

/* ---- a defrag loop ------------------------------------------------------- */

#define TABLE 12288
static const size_t table_sizes[3] = {64, 256, 1024};

/* Resident bytes of the small spans of the calling thread's heap (queues
 * and full list: pages touched and not parked), over the usable bytes of
 * the blocks in use in them. */
static size_t resident(const lull_span *s) {
    size_t touched = LULL_PAGES_OF((size_t)s->carved * s->block_size) / LULL_PAGE_SIZE;
    return (touched - s->parked_pages) * LULL_PAGE_SIZE;
}

static double span_ratio(size_t live_bytes) {
    lull_heap *h = lull_tl_heap;
    size_t bytes = 0;
    for (unsigned c = 0; c < lull_class_count; c++)
        for (lull_span *s = h->queue[c].head; s; s = s->next)
            bytes += resident(s);
    for (lull_span *s = h->full.head; s; s = s->next)
        bytes += resident(s);
    return (double)bytes / (double)live_bytes;
}

static void *defrag_loop(void *arg) {
    (void)arg;
    void **v = mmap(NULL, TABLE * sizeof(void *), PROT_READ | PROT_WRITE,
                    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    for (unsigned i = 0; i < TABLE; i++) {
        size_t n = table_sizes[i % 3];
        v[i] = lull_malloc(n);
        fill(v[i], n, i);
    }
    /* 3 in 4 deleted at random */
    uint64_t x = 42;
    size_t live = 0;
    for (unsigned i = 0; i < TABLE; i++) {
        x = mix(x + i);
        if (x % 4) {
            lull_free(v[i]);
            v[i] = NULL;
        } else {
            live += table_sizes[i % 3];
        }
    }
    double before = span_ratio(live);
    uint64_t returned = lull_tl_heap->spans_returned;
    /* passes over the table, in batches as a server's steps, until a pass
     * moves nothing (at most 20) */
    unsigned passes = 0, moved_total = 0;
    for (unsigned moved = 1; moved && passes < 20; passes++) {
        moved = 0;
        for (unsigned i = 0; i < TABLE; i += 32) {
            const void *batch[32];
            lull_defrag_info info[32];
            unsigned n = 0, idx[32];
            for (unsigned j = i; j < i + 32 && j < TABLE; j++)
                if (v[j]) {
                    idx[n] = j;
                    batch[n++] = v[j];
                }
            cr_assert_eq(lull_defrag_query(batch, n, info), 0);
            for (unsigned k = 0; k < n; k++) {
                if (!info[k].moved_would_help) continue;
                void *q = lull_defrag_move(v[idx[k]]);
                if (q != v[idx[k]]) moved++;
                v[idx[k]] = q;
            }
        }
        moved_total += moved;
    }
    double after = span_ratio(live);
    cr_log_info(
        "defrag loop: resident span bytes / live %.2f -> %.2f, %u moves in %u passes, %lu spans "
        "back",
        before, after, moved_total, passes,
        (unsigned long)(lull_tl_heap->spans_returned - returned));
    cr_assert_gt(before, 2.5, "75 %% deleted at random leaves the spans sparse (%.2f)", before);
    cr_assert_lt(after, 1.6, "after the loop the spans are dense (%.2f)", after);
    cr_assert_lt(passes, 20, "the loop converges");
    for (unsigned i = 0; i < TABLE; i++)
        if (v[i]) {
            cr_assert(intact(v[i], table_sizes[i % 3], i), "block %u", i);
            lull_free(v[i]);
        }
    return NULL;
}

Test(defrag, a_defrag_loop_makes_a_sparse_table_dense) {
    in_thread(defrag_loop, NULL);
}
