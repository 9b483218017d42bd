/* A threaded allocation workload to run under LD_PRELOAD=liblull.so.
 *
 * Threads (8 by default) make objects of 1 B .. 1 MiB (and four of 64 MiB),
 * write a pattern into every byte, and hand them to each other through a
 * shared queue; whoever takes one verifies every byte, may realloc it
 * (verifying the kept prefix), and passes it on or frees it. Also checked:
 * calloc returns zeroes (also over dirty freed memory), posix_memalign /
 * aligned_alloc / memalign / valloc alignment, malloc_usable_size >= the
 * request (and the slack is writable), and the error returns of impossible
 * requests.
 *
 * What each object goes through depends only on its seed, so the checksum
 * printed as "OK <checksum>" is the same for every allocator and every
 * interleaving. Any mismatch prints "FAIL: ..." on stderr and exits 1.
 *
 * Usage: prog_threaded_churn [threads [objects_per_thread]]
 */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <malloc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define KiB ((size_t)1024)
#define MiB (1024 * KiB)
#define MAX_THREADS 64
#define MAX_INFLIGHT 1024
#define BIG_SIZE (64 * MiB)
#define BIG_OBJECTS 4

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    dprintf(2, "FAIL: %s\n", buf);
    _exit(1);
}

static uint64_t splitmix(uint64_t *s) {
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* ---- the pattern: byte i of an object depends on (seed, i) only --------- */

static inline uint64_t pattern_word(uint64_t seed, size_t w) {
    return seed ^ ((uint64_t)w * 0x9e3779b97f4a7c15ull) ^ ((uint64_t)w >> 7);
}

/* Write the pattern into bytes [from, to) of p. */
static void fill(unsigned char *p, uint64_t seed, size_t from, size_t to) {
    size_t i = from;
    while (i < to && (i & 7)) {
        uint64_t w = pattern_word(seed, i / 8);
        p[i] = (unsigned char)(w >> ((i & 7) * 8));
        i++;
    }
    for (; i + 8 <= to; i += 8) {
        uint64_t w = pattern_word(seed, i / 8);
        memcpy(p + i, &w, 8);
    }
    for (; i < to; i++) {
        uint64_t w = pattern_word(seed, i / 8);
        p[i] = (unsigned char)(w >> ((i & 7) * 8));
    }
}

/* Verify bytes [0, n) of p; returns a hash of what was read. */
static uint64_t verify(const unsigned char *p, uint64_t seed, size_t n, const char *what) {
    uint64_t h = 0;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        uint64_t w, want = pattern_word(seed, i / 8);
        memcpy(&w, p + i, 8);
        if (w != want) {
            for (size_t b = 0; b < 8; b++)
                if (p[i + b] != (unsigned char)(want >> (b * 8)))
                    fail("%s: block %p of %zu bytes, byte %zu is 0x%02x, expected 0x%02x", what,
                         (const void *)p, n, i + b, p[i + b], (unsigned char)(want >> (b * 8)));
        }
        h = (h + w) * 0x100000001b3ull;
    }
    for (; i < n; i++) {
        unsigned char want = (unsigned char)(pattern_word(seed, i / 8) >> ((i & 7) * 8));
        if (p[i] != want)
            fail("%s: block %p of %zu bytes, byte %zu is 0x%02x, expected 0x%02x", what,
                 (const void *)p, n, i, p[i], want);
        h = (h + p[i]) * 0x100000001b3ull;
    }
    return h;
}

static void check_zero(const unsigned char *p, size_t n, const char *what) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != 0)
            fail("%s: %zu-byte block %p has 0x%02x at %zu", what, n, (const void *)p, p[i], i);
}

static void check_usable(void *p, size_t n, const char *what) {
    size_t u = malloc_usable_size(p);
    if (u < n) fail("%s: malloc_usable_size(%p) = %zu < %zu requested", what, p, u, n);
}

static void check_align(void *p, size_t align, const char *what) {
    if ((uintptr_t)p % align != 0) fail("%s: %p is not %zu-aligned", what, p, align);
}

/* ---- objects and the queue ---------------------------------------------- */

enum kind { K_MALLOC, K_CALLOC, K_MEMALIGN, K_ALIGNED_ALLOC, K_REALLOC_NULL, K_BIG, K_COUNT };

struct obj {
    struct obj *next;
    unsigned char *p;
    size_t size;
    uint64_t seed, rng;
    unsigned hops;
    enum kind kind;
};

static pthread_mutex_t q_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t q_cond = PTHREAD_COND_INITIALIZER;
static struct obj *q_head, *q_tail;
static _Atomic long inflight;
static _Atomic long freed_total;
static long total_objects;
static _Atomic uint64_t checksum;

static void push(struct obj *o) {
    o->next = NULL;
    pthread_mutex_lock(&q_lock);
    if (q_tail)
        q_tail->next = o;
    else
        q_head = o;
    q_tail = o;
    pthread_cond_signal(&q_cond);
    pthread_mutex_unlock(&q_lock);
}

static struct obj *pop(int wait_ms) {
    pthread_mutex_lock(&q_lock);
    if (!q_head && wait_ms > 0) {
        struct timespec t;
        clock_gettime(CLOCK_REALTIME, &t);
        t.tv_nsec += wait_ms * 1000000L;
        if (t.tv_nsec >= 1000000000L) {
            t.tv_sec++;
            t.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&q_cond, &q_lock, &t);
    }
    struct obj *o = q_head;
    if (o) {
        q_head = o->next;
        if (!q_head) q_tail = NULL;
    }
    pthread_mutex_unlock(&q_lock);
    return o;
}

/* 1 B .. 1 MiB, log-uniform. */
static size_t pick_size(uint64_t *rng) {
    unsigned bits = (unsigned)(splitmix(rng) % 21);
    return 1 + (size_t)(splitmix(rng) % ((size_t)1 << bits));
}

static struct obj *create(uint64_t seed, bool big) {
    struct obj *o = malloc(sizeof *o);
    if (!o) fail("malloc(%zu) failed", sizeof *o);
    o->seed = seed;
    o->rng = seed;
    o->kind = big ? K_BIG : (enum kind)(splitmix(&o->rng) % K_BIG);
    o->size = big ? BIG_SIZE : pick_size(&o->rng);
    o->hops = big ? 2 : (unsigned)(splitmix(&o->rng) % 4);
    size_t align = 0;
    void *p = NULL;
    switch (o->kind) {
    case K_MALLOC:
    case K_BIG:
        p = malloc(o->size);
        break;
    case K_CALLOC: {
        size_t n = 1 + (size_t)(splitmix(&o->rng) % 16);
        o->size = (o->size + n - 1) / n * n;
        p = calloc(n, o->size / n);
        if (p) check_zero(p, o->size, "calloc");
        break;
    }
    case K_MEMALIGN:
        align = (size_t)8 << (splitmix(&o->rng) % 10); /* 8 .. 4096 */
        if (splitmix(&o->rng) % 8 == 0) align = 2 * MiB;
        if (posix_memalign(&p, align, o->size) != 0) p = NULL;
        break;
    case K_ALIGNED_ALLOC:
        align = (size_t)16 << (splitmix(&o->rng) % 9); /* 16 .. 4096 */
        o->size = (o->size + align - 1) / align * align;
        p = aligned_alloc(align, o->size);
        break;
    case K_REALLOC_NULL:
        p = realloc(NULL, o->size);
        break;
    case K_COUNT:
        break;
    }
    if (!p) fail("allocation of %zu bytes (kind %d) failed", o->size, (int)o->kind);
    if (align) check_align(p, align, "posix_memalign/aligned_alloc");
    check_usable(p, o->size, "new block");
    o->p = p;
    /* The slack up to the usable size is ours to write (a bounded piece). */
    size_t usable = malloc_usable_size(p),
           slack_end = usable < o->size + 4 * KiB ? usable : o->size + 4 * KiB;
    memset(o->p + o->size, 0xee, slack_end - o->size);
    fill(o->p, seed, 0, o->size);
    atomic_fetch_add(&inflight, 1);
    return o;
}

static void finish(struct obj *o) {
    uint64_t h = verify(o->p, o->seed, o->size, "before free");
    atomic_fetch_add(&checksum, h ^ (o->size * 0x2545f4914f6cdd1dull) ^ o->seed);
    free(o->p);
    free(o);
    atomic_fetch_sub(&inflight, 1);
    if (atomic_fetch_add(&freed_total, 1) + 1 == total_objects) {
        pthread_mutex_lock(&q_lock);
        pthread_cond_broadcast(&q_cond);
        pthread_mutex_unlock(&q_lock);
    }
}

/* One hop: verify everything, maybe realloc, pass on (or free at the end). */
static void process(struct obj *o) {
    verify(o->p, o->seed, o->size, "handed over");
    if (o->hops == 0) {
        finish(o);
        return;
    }
    o->hops--;
    size_t ns = o->size;
    if (o->kind == K_BIG) {
        ns = o->hops == 1 ? BIG_SIZE + MiB : BIG_SIZE / 2; /* grow, then shrink */
    } else {
        switch (splitmix(&o->rng) % 4) {
        case 0:
            break;
        case 1:
            ns = pick_size(&o->rng);
            break;
        case 2:
            ns = o->size * 2 > 4 * MiB ? o->size : o->size * 2;
            break;
        case 3:
            ns = o->size / 3 ? o->size / 3 : 1;
            break;
        }
    }
    if (ns != o->size) {
        unsigned char *np = realloc(o->p, ns);
        if (!np) fail("realloc(%p, %zu) failed", (void *)o->p, ns);
        size_t keep = ns < o->size ? ns : o->size;
        verify(np, o->seed, keep, "after realloc");
        check_usable(np, ns, "realloc");
        if (ns > o->size) fill(np, o->seed, o->size, ns);
        o->p = np;
        o->size = ns;
    }
    push(o);
}

struct worker {
    pthread_t th;
    int id;
    long objects;
};

static void *work(void *arg) {
    struct worker *w = arg;
    long made = 0;
    for (;;) {
        if (made < w->objects && atomic_load(&inflight) < MAX_INFLIGHT) {
            uint64_t s = ((uint64_t)w->id << 40) ^ (uint64_t)made;
            uint64_t seed = splitmix(&s);
            bool big = w->id < BIG_OBJECTS && made == w->objects / 2;
            struct obj *o = create(seed, big);
            made++;
            if (!big && (seed & 15) == 0)
                process(o); /* the maker's own first hop */
            else
                push(o);
            /* Take one in between, so that queues do not only grow. */
            struct obj *t = pop(0);
            if (t) process(t);
            continue;
        }
        struct obj *o = pop(made < w->objects ? 1 : 20);
        if (o) {
            process(o);
            continue;
        }
        if (made == w->objects && atomic_load(&freed_total) == total_objects) break;
    }
    return NULL;
}

/* ---- single-threaded checks --------------------------------------------- */

static void basic_checks(void) {
    /* Impossible requests fail cleanly. */
    volatile size_t huge = SIZE_MAX / 2; /* volatile: keep the compiler from judging */
    errno = 0;
    void *p = malloc(huge);
    if (p || errno != ENOMEM) fail("malloc(SIZE_MAX/2) = %p errno %d", p, errno);
    errno = 0;
    p = calloc(huge, 3);
    if (p || errno != ENOMEM) fail("calloc overflow = %p errno %d", p, errno);
    p = malloc(16);
    errno = 0;
    void *q = realloc(p, huge);
    if (q) fail("realloc(p, SIZE_MAX/2) = %p", q); /* errno: jemalloc leaves it */
    free(p);                                       /* still valid after a failed realloc */
    if (posix_memalign(&p, 24, 64) != EINVAL) fail("posix_memalign(24) did not fail with EINVAL");
    if (posix_memalign(&p, 4, 64) != EINVAL) fail("posix_memalign(4) did not fail with EINVAL");
    free(NULL);

    /* Zero-size requests return something free() accepts. */
    free(malloc(0));
    free(calloc(0, 8));
    free(calloc(8, 0));

    /* Alignment of the other entry points. */
    static const size_t aligns[] = {16, 64, 256, 4096, 65536, 2 * MiB};
    for (size_t i = 0; i < sizeof aligns / sizeof aligns[0]; i++) {
        size_t a = aligns[i];
        for (size_t n = 1; n <= 3 * a; n += a / 2 + 1) {
            if (posix_memalign(&p, a, n) != 0) fail("posix_memalign(%zu, %zu) failed", a, n);
            check_align(p, a, "posix_memalign");
            check_usable(p, n, "posix_memalign");
            memset(p, 0x11, n);
            free(p);
            p = aligned_alloc(a, (n + a - 1) / a * a);
            if (!p) fail("aligned_alloc(%zu) failed", a);
            check_align(p, a, "aligned_alloc");
            free(p);
            p = memalign(a, n);
            if (!p) fail("memalign(%zu) failed", a);
            check_align(p, a, "memalign");
            free(p);
        }
    }
    long page = sysconf(_SC_PAGESIZE);
    p = valloc(100);
    if (!p) fail("valloc failed");
    check_align(p, (size_t)page, "valloc");
    free(p);

    /* calloc over memory that was just freed dirty. */
    static const size_t sizes[] = {8, 24, 100, 1000, 4096, 40000, 300 * KiB, MiB, 8 * MiB};
    static void *blocks[256];
    for (size_t s = 0; s < sizeof sizes / sizeof sizes[0]; s++) {
        size_t n = sizes[s] >= MiB ? 4 : sizes[s] >= 64 * KiB ? 16 : 256;
        for (size_t i = 0; i < n; i++) {
            blocks[i] = malloc(sizes[s]);
            if (!blocks[i]) fail("malloc(%zu) failed", sizes[s]);
            memset(blocks[i], 0xff, sizes[s]);
        }
        for (size_t i = 0; i < n; i++)
            free(blocks[i]);
        for (size_t i = 0; i < n; i++) {
            blocks[i] = calloc(1, sizes[s]);
            if (!blocks[i]) fail("calloc(%zu) failed", sizes[s]);
            check_zero(blocks[i], sizes[s], "calloc after free");
            memset(blocks[i], 0xff, sizes[s]);
        }
        for (size_t i = 0; i < n; i++)
            free(blocks[i]);
    }

    /* A realloc chain growing a byte at a time then in big steps, and back. */
    unsigned char *c = NULL;
    size_t n = 0;
    for (size_t ns = 1; ns <= 8 * MiB; ns = ns < 4096 ? ns + 1 : ns + ns / 3) {
        c = realloc(c, ns);
        if (!c) fail("realloc chain: %zu failed", ns);
        verify(c, 42, n, "realloc chain");
        fill(c, 42, n, ns);
        n = ns;
    }
    while (n > 1) {
        n /= 2;
        c = realloc(c, n);
        if (!c) fail("realloc shrink to %zu failed", n);
        verify(c, 42, n, "realloc shrink");
    }
    free(c);
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 8;
    long per_thread = argc > 2 ? atol(argv[2]) : 800;
    if (threads < 1 || threads > MAX_THREADS || per_thread < 1) {
        fprintf(stderr, "usage: %s [threads (1..%d) [objects_per_thread]]\n", argv[0], MAX_THREADS);
        return 2;
    }
    basic_checks();

    total_objects = threads * per_thread;
    static struct worker w[MAX_THREADS];
    for (int i = 0; i < threads; i++) {
        w[i].id = i;
        w[i].objects = per_thread;
        int rc = pthread_create(&w[i].th, NULL, work, &w[i]);
        if (rc != 0) fail("pthread_create: %s", strerror(rc));
    }
    for (int i = 0; i < threads; i++)
        pthread_join(w[i].th, NULL);
    if (atomic_load(&freed_total) != total_objects || atomic_load(&inflight) != 0 || q_head)
        fail("%ld of %ld objects freed, %ld in flight", (long)atomic_load(&freed_total),
             total_objects, (long)atomic_load(&inflight));
    printf("OK %016" PRIx64 "\n", atomic_load(&checksum));
    return 0;
}
