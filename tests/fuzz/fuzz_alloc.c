/* libFuzzer target: the input is a program of allocator operations, run
 * against lull's lull_* API (lull built with LULL_OVERRIDE=OFF, so libFuzzer
 * and AddressSanitizer keep the system malloc) and checked against a shadow
 * model of every live block: its requested size, alignment and a content
 * pattern over its whole usable size (sampled above 16 KiB).
 *
 * Checked after every operation that touches a block:
 *   - the block is aligned (8 bytes, 16 from 9 bytes on, or as asked),
 *     lull_usable_size() >= the size asked for, lull_owns() is true;
 *   - its content is what was written (before free and realloc, and for
 *     every live block at the end of each input): blocks never overlap, a
 *     purge never zeroes a live block, realloc keeps the prefix;
 *   - calloc'd memory reads as zeros; invalid requests fail with the right
 *     errno (ENOMEM for absurd sizes and overflowing calloc, EINVAL for bad
 *     alignments).
 * Some frees are handed to a second thread through a queue (remote frees),
 * and the reclaim thread purges with delay 0 throughout.
 *
 * Input format (each operation is an opcode byte and its argument bytes;
 * missing bytes read as 0):
 *   op % 16: 0-2 malloc, 3 calloc, 4-5 realloc, 6 aligned_alloc,
 *            7 posix_memalign, 8-9 free, 10 free_sized / free_aligned_sized,
 *            11 free on the second thread, 12 realloc to 0, 13 invalid
 *            requests, 14 rewrite a block, 15 collect / reclaim tick
 *   size: a class byte then two bytes (see read_size). */
#define _GNU_SOURCE
#include "lull.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define MAX_LIVE 256
#define MAX_OPS 4096
#define LIVE_BYTES_CAP (192 * MiB) /* keep a run's memory bounded */
#define FULL_PATTERN_MAX (16 * KiB)
#define SAMPLE_STEP (16 * KiB)

typedef struct {
    uint8_t *p;
    size_t size;   /* bytes asked for */
    size_t usable; /* lull_usable_size() when allocated */
    size_t align;  /* asked alignment (1: none) */
    size_t sized;  /* the size to give free_sized (C23: the last size asked) */
    bool aligned;  /* from aligned_alloc / posix_memalign: free_aligned_sized */
    uint32_t seed;
} block;

static block live[MAX_LIVE];
static int nlive;
static size_t live_bytes;

/* ---- failure ----------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void fail(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "fuzz_alloc: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort(); /* libFuzzer saves the input as a crash */
}

/* ---- the pattern ------------------------------------------------------- */

/* Cheap (the loops vectorise) and different for every seed and offset in
 * the bits that matter: a block overwritten by another's pattern, or zeroed,
 * shows. */
static inline uint8_t pat(uint32_t seed, size_t off) {
    return (uint8_t)((seed + (uint32_t)off * 0x9E3779B1u) >> 24) ^ (uint8_t)(off >> 12);
}

/* Offsets written: all of a small block's usable size; for larger ones the
 * first and last 4 KiB and one byte every 16 KiB (every 4 KiB page is not
 * needed to see a purge: it drops whole 64 KiB slices). */
#define FOR_EACH_OFFSET(len, off, body)                                                            \
    do {                                                                                           \
        if ((len) <= FULL_PATTERN_MAX) {                                                           \
            for (size_t off = 0; off < (len); off++)                                               \
                body;                                                                              \
        } else {                                                                                   \
            for (size_t off = 0; off < 4 * KiB; off++)                                             \
                body;                                                                              \
            for (size_t off = 4 * KiB; off < (len)-4 * KiB; off += SAMPLE_STEP)                    \
                body;                                                                              \
            for (size_t off = (len)-4 * KiB; off < (len); off++)                                   \
                body;                                                                              \
        }                                                                                          \
    } while (0)

static void fill(block *b) {
    uint8_t *p = b->p;
    uint32_t seed = b->seed;
    FOR_EACH_OFFSET(b->usable, off, p[off] = pat(seed, off));
}

/* The bytes fill() wrote (which depend on the usable size), up to len. */
static void check_content(const block *b, size_t len, const char *when) {
    const uint8_t *p = b->p;
    uint32_t seed = b->seed;
    FOR_EACH_OFFSET(b->usable, off,
                    if (off < len && p[off] != pat(seed, off))
                        fail("%s: block %p (size %zu, usable %zu) byte %zu is %#x, not %#x", when,
                             (void *)p, b->size, b->usable, off, p[off], pat(seed, off)));
}

/* ---- the second thread -------------------------------------------------- */

#define QUEUE_SLOTS 512
static struct {
    pthread_mutex_t lock;
    pthread_cond_t cond, idle;
    void *slot[QUEUE_SLOTS];
    unsigned head, tail; /* tail - head blocks waiting */
    bool busy;
} Q = {.lock = PTHREAD_MUTEX_INITIALIZER,
       .cond = PTHREAD_COND_INITIALIZER,
       .idle = PTHREAD_COND_INITIALIZER};

static void *freer(void *arg) {
    (void)arg;
    pthread_mutex_lock(&Q.lock);
    for (;;) {
        while (Q.head == Q.tail) {
            Q.busy = false;
            pthread_cond_broadcast(&Q.idle);
            pthread_cond_wait(&Q.cond, &Q.lock);
        }
        Q.busy = true;
        void *p = Q.slot[Q.head++ % QUEUE_SLOTS];
        pthread_mutex_unlock(&Q.lock);
        lull_free(p);
        pthread_mutex_lock(&Q.lock);
    }
    return NULL;
}

static void queue_free(void *p) {
    pthread_mutex_lock(&Q.lock);
    while (Q.tail - Q.head == QUEUE_SLOTS)
        pthread_cond_wait(&Q.idle, &Q.lock);
    Q.slot[Q.tail++ % QUEUE_SLOTS] = p;
    pthread_cond_signal(&Q.cond);
    pthread_mutex_unlock(&Q.lock);
}

/* Wait until the second thread has freed everything it was given. */
static void queue_drain(void) {
    pthread_mutex_lock(&Q.lock);
    while (Q.head != Q.tail || Q.busy)
        pthread_cond_wait(&Q.idle, &Q.lock);
    pthread_mutex_unlock(&Q.lock);
}

/* ---- reading the input ------------------------------------------------- */

typedef struct {
    const uint8_t *d;
    size_t n, at;
} reader;

static uint8_t byte(reader *r) {
    return r->at < r->n ? r->d[r->at++] : 0;
}
static uint16_t u16(reader *r) {
    return (uint16_t)(byte(r) | byte(r) << 8);
}

/* Mostly small sizes, some medium and large, now and then a huge one. */
static size_t read_size(reader *r) {
    uint8_t cls = byte(r);
    uint16_t v = u16(r);
    switch (cls % 16) {
    case 0:
        return v % 17; /* 0..16 */
    case 1:
    case 2:
    case 3:
    case 4:
        return v % 257; /* tiny */
    case 5:
    case 6:
    case 7:
        return v % 2049; /* small */
    case 8:
    case 9:
        return v % (32 * KiB + 1);
    case 10:
        return 32 * KiB + (size_t)v * 8; /* to ~544 KiB: the last classes */
    case 11:
        return 500 * KiB + (size_t)v * 16; /* large spans from 512 KiB */
    case 12:
        return MiB + (size_t)v * 48; /* to ~4 MiB */
    case 13:
        return (size_t)v % 4 == 0 ? 15 * MiB + v * 32 : v % 4096; /* near 16 MiB */
    case 14:
        return cls == 0xfe ? 17 * MiB + (size_t)v * 352 : v % 64; /* huge: 17-40 MiB */
    default:
        return (size_t)1 << (v % 21); /* powers of two */
    }
}

static size_t read_align(reader *r) {
    uint8_t a = byte(r);
    unsigned shift = a % 16 < 12 ? 3 + a % 12 : (a % 16 == 12 ? 16 : 20 + a % 6);
    return (size_t)1 << shift; /* 8 B .. 16 KiB, 64 KiB, or 1-32 MiB */
}

/* ---- checks on a new block --------------------------------------------- */

static void check_new(const block *b, const char *what) {
    uintptr_t a = (uintptr_t)b->p;
    if (a % 8) fail("%s(%zu) = %p: not 8-byte aligned", what, b->size, (void *)b->p);
    if (b->size > 8 && a % 16)
        fail("%s(%zu) = %p: not 16-byte aligned", what, b->size, (void *)b->p);
    if (a % b->align)
        fail("%s(%zu) = %p: not aligned to %zu", what, b->size, (void *)b->p, b->align);
    if (b->usable < b->size)
        fail("%s(%zu) = %p: usable size %zu", what, b->size, (void *)b->p, b->usable);
    if (!lull_owns(b->p)) fail("%s(%zu) = %p: lull_owns() false", what, b->size, (void *)b->p);
}

static bool room_for(size_t size) {
    return nlive < MAX_LIVE && live_bytes + size <= LIVE_BYTES_CAP;
}

static void add_block(void *p, size_t size, size_t align, bool aligned, uint32_t seed,
                      const char *what) {
    block b = {p, size, lull_usable_size(p), align, size, aligned, seed};
    check_new(&b, what);
    fill(&b);
    live[nlive++] = b;
    live_bytes += b.usable;
}

static block take_block(int i) {
    block b = live[i];
    live[i] = live[--nlive];
    live_bytes -= b.usable;
    return b;
}

static void expect_zero(const uint8_t *p, size_t size, const char *what) {
    FOR_EACH_OFFSET(
        size, off, if (p[off]) fail("%s(%zu) = %p: byte %zu not zero", what, size, (void *)p, off));
}

/* ---- the operations ----------------------------------------------------- */

static void op_free(int i, int how) {
    block b = take_block(i);
    check_content(&b, b.usable, "free");
    switch (how) {
    case 0:
        lull_free(b.p);
        break;
    case 1: {
#ifdef FUZZ_AVOID_KNOWN_BUGS
        /* "any size up to the usable size" (lull.h), not the C23 size: a
         * block kept in place by a shrinking realloc is refused with the
         * size given to realloc (regress/free_sized_after_shrinking_realloc) */
        size_t sized = b.usable;
#else
        size_t sized = b.sized;
#endif
        if (b.aligned)
            lull_free_aligned_sized(b.p, b.align, sized);
        else
            lull_free_sized(b.p, sized);
        break;
    }
    case 2:
        queue_free(b.p);
        break;
    default: {
        errno = 0;
        void *q = lull_realloc(b.p, 0);
        if (q) fail("realloc(%p, 0) = %p", (void *)b.p, q);
    }
    }
}

static void op_realloc(reader *r, int i, uint32_t seed) {
    size_t size = read_size(r);
    block *b = &live[i];
    if (size > b->usable && !room_for(size - b->usable)) return;
    check_content(b, b->usable, "realloc (before)");
    if (size == 0) size = 1; /* 0 frees: op 12 */
    uint8_t *q = lull_realloc(b->p, size);
    if (!q) fail("realloc(%p, %zu) failed", (void *)b->p, size);
    block old = *b;
    old.p = q;
    /* the content moved with it (the pattern is by offset, not address) */
    check_content(&old, size < old.usable ? size : old.usable, "realloc (kept prefix)");
    take_block(i);
    /* C23: free_sized of a realloc'd block takes the size given to realloc */
    block nb = {q, size, lull_usable_size(q), 1, size, false, seed};
    check_new(&nb, "realloc");
    fill(&nb);
    live[nlive++] = nb;
    live_bytes += nb.usable;
}

static void op_invalid(reader *r) {
    switch (byte(r) % 6) {
    case 0: {
        errno = 0;
        void *p = lull_malloc(((size_t)1 << 47) + u16(r));
        if (p || errno != ENOMEM) fail("malloc(2^47) = %p, errno %d", p, errno);
        break;
    }
    case 1: {
        errno = 0;
        void *p = lull_calloc(((size_t)1 << 40) + u16(r), (size_t)1 << 30);
        if (p || errno != ENOMEM) fail("calloc overflow = %p, errno %d", p, errno);
        break;
    }
    case 2: {
        errno = 0;
        size_t align = (size_t)(u16(r) | 1) * 3; /* not a power of two */
        void *p = lull_aligned_alloc(align, 64);
        if (p || errno != EINVAL) fail("aligned_alloc(%zu) = %p, errno %d", align, p, errno);
        break;
    }
    case 3: {
        void *out = (void *)1;
        int e = lull_posix_memalign(&out, 4, 64); /* not a multiple of sizeof(void *) */
        if (e != EINVAL || out != (void *)1) fail("posix_memalign(4) = %d", e);
        break;
    }
    case 4: {
        errno = 0;
        void *p = lull_realloc(NULL, SIZE_MAX - u16(r));
        if (p || errno != ENOMEM) fail("realloc(NULL, ~0) = %p, errno %d", p, errno);
        break;
    }
    default:
        if (lull_usable_size(NULL) != 0) fail("usable_size(NULL)");
        lull_free(NULL);
        lull_free_sized(NULL, 10);
        break;
    }
}

static int pick(reader *r) {
    return nlive ? (int)(u16(r) % (unsigned)nlive) : -1;
}

static void run(const uint8_t *data, size_t size) {
    reader r = {data, size, 0};
    uint32_t seed = 0x9e3779b9u ^ (uint32_t)size;
    for (int ops = 0; ops < MAX_OPS && r.at < r.n; ops++) {
        uint8_t op = byte(&r);
        seed = seed * 1664525u + 1013904223u;
        switch (op % 16) {
        case 0:
        case 1:
        case 2: {
            size_t s = read_size(&r);
            if (!room_for(s)) break;
            void *p = lull_malloc(s);
            if (!p) fail("malloc(%zu) failed", s);
            add_block(p, s, 1, false, seed, "malloc");
            break;
        }
        case 3: {
            size_t s = read_size(&r);
            size_t n = 1 + byte(&r) % 4;
            if (!room_for(s)) break;
            uint8_t *p = lull_calloc(n, s / n);
            if (!p) fail("calloc(%zu, %zu) failed", n, s / n);
            expect_zero(p, n * (s / n), "calloc");
            add_block(p, n * (s / n), 1, false, seed, "calloc");
            break;
        }
        case 4:
        case 5: {
            int i = pick(&r);
            if (i >= 0) op_realloc(&r, i, seed);
            break;
        }
        case 6:
        case 7: {
            size_t align = read_align(&r);
            size_t s = read_size(&r);
            if (!room_for(s + align)) break;
#ifdef FUZZ_AVOID_KNOWN_BUGS
            if (s == 0) s = 1; /* regress/aligned_alloc_size_0_alignment_8MiB */
#endif
            void *p = NULL;
            if (op % 16 == 6) {
                p = lull_aligned_alloc(align, s);
                if (!p) fail("aligned_alloc(%zu, %zu) failed", align, s);
            } else {
                int e = lull_posix_memalign(&p, align, s);
                if (e) fail("posix_memalign(%zu, %zu) = %d", align, s, e);
            }
            add_block(p, s, align, true, seed, op % 16 == 6 ? "aligned_alloc" : "posix_memalign");
            break;
        }
        case 8:
        case 9:
        case 10:
        case 11:
        case 12: {
            int i = pick(&r);
            if (i >= 0) op_free(i, op % 16 <= 9 ? 0 : op % 16 - 9);
            break;
        }
        case 13:
            op_invalid(&r);
            break;
        case 14: {
            int i = pick(&r);
            if (i < 0) break;
            check_content(&live[i], live[i].usable, "rewrite");
            live[i].seed = seed;
            fill(&live[i]);
            break;
        }
        default:
            if (byte(&r) % 8 == 0)
                lull_reclaim_now();
            else
                lull_thread_collect();
            break;
        }
    }
    /* the end of an input: every block still intact, then all freed */
    while (nlive)
        op_free(nlive - 1, (int)(nlive % 3));
    queue_drain();
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc;
    (void)argv;
    lull_set_purge_delay_ms(0); /* purges race with every reuse */
    pthread_t t;
    if (pthread_create(&t, NULL, freer, NULL) != 0) fail("pthread_create");
    pthread_detach(t);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    run(data, size);
    return 0;
}
