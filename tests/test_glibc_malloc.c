/* glibc's <malloc.h> calls answered from lull's heap (src/glibc_malloc.c):
 * malloc_trim, mallinfo2, mallinfo, malloc_stats, malloc_info. Each is
 * called by its lull_* name and, where lull replaces malloc (this program
 * links liblull.a), by glibc's name: before they were lull's, those names
 * were glibc's, which describe glibc's empty main arena and trim nothing.
 * tests/test_preload_programs.c calls them under LD_PRELOAD. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/mem_check.h"
#include "tests/support/reclaim_hold.h"
#include "tests/support/reexec.h"
#include "tests/support/timing.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <malloc.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)
#define SMALL_BLOCKS 512
#define SMALL_SIZE ((size_t)4000)
#define LARGE_SIZE (8 * MiB) /* a large block: a span of slices */
#define HUGE_SIZE (40 * MiB) /* a huge block: a mapping of its own */

/* The figures by the name under test: glibc's where lull exports it. */
static struct lull_mallinfo2 info(void) {
#ifdef LULL_OVERRIDE
    struct mallinfo2 g = mallinfo2();
    struct lull_mallinfo2 m;
    _Static_assert(sizeof g == sizeof m, "struct mallinfo2's fields");
    memcpy(&m, &g, sizeof m);
    return m;
#else
    return lull_mallinfo2();
#endif
}

static int trim(size_t pad) {
#ifdef LULL_OVERRIDE
    return malloc_trim(pad);
#else
    return lull_malloc_trim(pad);
#endif
}

static void expect_identity(const struct lull_mallinfo2 *m, const char *when) {
    cr_expect_eq(m->arena, m->uordblks + m->fordblks,
                 "%s: arena %zu != uordblks %zu + fordblks %zu", when, m->arena, m->uordblks,
                 m->fordblks);
    cr_expect_leq(m->keepcost, m->fordblks, "%s: keepcost %zu > fordblks %zu", when, m->keepcost,
                  m->fordblks);
    cr_expect_eq(m->ordblks + m->smblks + m->usmblks + m->fsmblks, 0, "%s", when);
}

Test(glibc_malloc, mallinfo2_follows_small_and_large_blocks) {
    static char *blocks[SMALL_BLOCKS];
    struct lull_mallinfo2 m0 = info();
    expect_identity(&m0, "at start");
    for (int i = 0; i < SMALL_BLOCKS; i++) {
        blocks[i] = lull_malloc(SMALL_SIZE);
        memset(blocks[i], 1, SMALL_SIZE);
    }
    char *large = lull_malloc(LARGE_SIZE);
    memset(large, 1, LARGE_SIZE);
    size_t n = SMALL_BLOCKS * SMALL_SIZE + LARGE_SIZE;
    struct lull_mallinfo2 m1 = info();
    expect_identity(&m1, "with the blocks");
    cr_expect_geq(m1.uordblks, m0.uordblks + n, "uordblks %zu -> %zu after %zu bytes allocated",
                  m0.uordblks, m1.uordblks, n);
    cr_expect_eq(m1.hblks, m0.hblks, "a large block counted as huge");
    for (int i = 0; i < SMALL_BLOCKS; i++)
        lull_free(blocks[i]);
    lull_free(large);
    struct lull_mallinfo2 m2 = info();
    expect_identity(&m2, "after the frees");
    cr_expect_leq(m2.uordblks + n, m1.uordblks, "uordblks %zu -> %zu after %zu bytes freed",
                  m1.uordblks, m2.uordblks, n);
    cr_expect_geq(m2.fordblks, m1.fordblks + n, "fordblks %zu -> %zu after %zu bytes freed",
                  m1.fordblks, m2.fordblks, n);
}

Test(glibc_malloc, mallinfo2_counts_huge_blocks_in_hblks_and_hblkhd) {
    struct lull_mallinfo2 m0 = info();
    char *p = lull_malloc(HUGE_SIZE);
    cr_assert_not_null(p);
    struct lull_mallinfo2 m1 = info();
    expect_identity(&m1, "with a huge block");
    cr_expect_eq(m1.hblks, m0.hblks + 1, "hblks %zu -> %zu", m0.hblks, m1.hblks);
    cr_expect_geq(m1.hblkhd, m0.hblkhd + HUGE_SIZE, "hblkhd %zu -> %zu", m0.hblkhd, m1.hblkhd);
    /* glibc's uordblks has no mmapped chunk in it either */
    cr_expect_lt(m1.uordblks, m0.uordblks + MiB, "uordblks %zu -> %zu: the huge block in it too",
                 m0.uordblks, m1.uordblks);
    lull_free(p);
    struct lull_mallinfo2 m2 = info();
    cr_expect_eq(m2.hblks, m0.hblks);
    cr_expect_eq(m2.hblkhd, m0.hblkhd);
}

/* Freed, touched memory of each kind (small spans, a large block, a huge
 * block) with purging off: malloc_trim(0) gives it back, says so, and the
 * process's RSS and lull's figures drop. With nothing freed since, a
 * second trim has nothing to give back. */
Test(glibc_malloc, malloc_trim_gives_back_freed_memory_and_says_so) {
    static char *blocks[SMALL_BLOCKS];
    lull_set_purge_delay_ms(-1); /* only the trim purges */
    lull_reclaim_now();          /* the thread's start is no part of the RSS figures */
    for (int i = 0; i < SMALL_BLOCKS; i++) {
        blocks[i] = lull_malloc(SMALL_SIZE);
        memset(blocks[i], 1, SMALL_SIZE);
    }
    char *large = lull_malloc(LARGE_SIZE), *huge = lull_malloc(HUGE_SIZE);
    memset(large, 1, LARGE_SIZE);
    memset(huge, 1, HUGE_SIZE);
    for (int i = 0; i < SMALL_BLOCKS; i++)
        lull_free(blocks[i]);
    lull_free(large);
    lull_free(huge);
    lull_thread_collect(); /* the emptied spans too, as the trim's purge does */
    struct lull_mallinfo2 m0 = info();
    size_t rss0 = rss_bytes();
    cr_expect_geq(m0.keepcost, LARGE_SIZE + HUGE_SIZE, "keepcost %zu before the trim", m0.keepcost);
    int r = trim(0);
    size_t rss1 = rss_bytes();
    struct lull_mallinfo2 m1 = info();
    cr_expect_eq(r, 1, "malloc_trim(0) returned %d after %zu MiB were freed", r,
                 (LARGE_SIZE + HUGE_SIZE) >> 20);
    cr_expect_leq(rss1 + LARGE_SIZE + HUGE_SIZE * 9 / 10, rss0,
                  "RSS %zu KiB -> %zu KiB over the trim", rss0 >> 10, rss1 >> 10);
    cr_expect_leq(m1.arena + LARGE_SIZE + HUGE_SIZE, m0.arena, "arena %zu -> %zu over the trim",
                  m0.arena, m1.arena);
    cr_expect_lt(m1.keepcost, MiB, "keepcost %zu after the trim", m1.keepcost);
    expect_identity(&m1, "after the trim");
    r = trim(0);
    cr_expect_eq(r, 0, "a second malloc_trim(0), nothing freed since, returned %d", r);
}

/* malloc_trim() leaves errno as its caller had it, as glibc's does: its
 * wait for the reclaim thread's purge is a futex wait polled every 50 ms,
 * and each poll that timed out set errno to ETIMEDOUT (EAGAIN when the
 * tick ended just before one). Made deterministic with the reclaim thread
 * held in its tick (tests/support/reclaim_hold.h): the trim's wait cannot
 * end until it is let go, which is once the trimming thread has gone to
 * sleep three times (its voluntary context switches), so at least two of
 * its sleeps ended with no tick done, by their own bound. */
static _Atomic pid_t trimmer_tid;

static void *trim_keeping_errno(void *arg) {
    (void)arg;
    trimmer_tid = gettid();
    errno = EDOM;
    trim(0);
    return (void *)(intptr_t)errno;
}

static long voluntary_switches(pid_t tid) {
    char path[64], line[128];
    snprintf(path, sizeof path, "/proc/self/task/%d/status", (int)tid);
    FILE *f = fopen(path, "r");
    long n = -1;
    if (!f) return n;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "voluntary_ctxt_switches: %ld", &n) == 1) break;
    fclose(f);
    return n;
}

Test(glibc_malloc, malloc_trim_leaves_errno_as_it_was) {
    if (!lull_reclaim_now()) cr_skip_test("no reclaim thread: the trim waits for nothing");
    cr_assert(reclaim_hold(), "the reclaim thread was not held");
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, trim_keeping_errno, NULL), 0);
    while (!trimmer_tid)
        sleep_ms(1);
    long start = voluntary_switches(trimmer_tid);
    cr_assert_geq(start, 0, "no /proc/self/task/%d/status", (int)trimmer_tid);
    while (voluntary_switches(trimmer_tid) < start + 3)
        sleep_ms(1);
    cr_assert(reclaim_release());
    void *err;
    cr_assert_eq(pthread_join(t, &err), 0);
    cr_expect_eq((int)(intptr_t)err, EDOM, "errno %d (%s) after malloc_trim(0)", (int)(intptr_t)err,
                 strerror((int)(intptr_t)err));
}

/* With no reclaim thread (its start failed: LULL_FAULT=thread_create, in a
 * new process of this program), the trim's caller purges, and its result
 * says so all the same: the caller's purges are counted apart
 * (lull_stats_given_back). */
static void trim_on_the_caller(void) {
    char *large = lull_malloc(LARGE_SIZE), *huge = lull_malloc(HUGE_SIZE);
    if (!large || !huge) _exit(3);
    memset(large, 1, LARGE_SIZE);
    memset(huge, 1, HUGE_SIZE);
    if (lull_reclaim_now()) _exit(4); /* a reclaim thread runs after all */
    lull_free(large);
    lull_free(huge);
    size_t rss0 = rss_bytes();
    int first = lull_malloc_trim(0);
    size_t rss1 = rss_bytes();
    int second = lull_malloc_trim(0);
    printf("first=%d\nsecond=%d\nrss_before=%zu\nrss_after=%zu\n", first, second, rss0, rss1);
    fflush(stdout);
    _exit(0);
}

/* The same trim, every purge refused (LULL_FAULT=purge_nomem: madvise
 * fails with ENOMEM): the refusals are counted, and errno stays. */
static void trim_on_the_caller_refused(void) {
    char *large = lull_malloc(LARGE_SIZE);
    if (!large) _exit(3);
    memset(large, 1, LARGE_SIZE);
    if (lull_reclaim_now()) _exit(4);
    lull_free(large);
    struct lull_counters c0, c1;
    if (lull_stats(&c0) != 0) _exit(5);
    errno = EDOM;
    trim(0);
    int err = errno;
    if (lull_stats(&c1) != 0) _exit(5);
    printf("errno=%d\nrefused=%llu\n", err,
           (unsigned long long)(c1.purge_errors - c0.purge_errors));
    fflush(stdout);
    _exit(0);
}

__attribute__((constructor(200))) static void child(void) {
    if (getenv("LULL_TEST_TRIM_CALLER")) trim_on_the_caller();
    if (getenv("LULL_TEST_TRIM_CALLER_REFUSED")) trim_on_the_caller_refused();
}

Test(glibc_malloc, malloc_trim_without_a_reclaim_thread_purges_on_its_caller, .timeout = 120) {
    const char *vars[] = {"LULL_TEST_TRIM_CALLER=1", "LULL_FAULT=thread_create",
                          "LULL_CONF=warm_reserve_mb=0,refault_monitor=off", NULL};
    child_run cr;
    reexec_run("test_glibc_malloc", vars, "trim on the caller", 60000, &cr);
    reexec_assert_exited_0(&cr, "trim on the caller");
    cr_expect_eq(reexec_field(&cr, "first"), 1, "the trim of %zu MiB freed returned 0",
                 (LARGE_SIZE + HUGE_SIZE) >> 20);
    cr_expect_eq(reexec_field(&cr, "second"), 0, "a second trim, nothing freed since, returned 1");
    uint64_t before = reexec_field(&cr, "rss_before"), after = reexec_field(&cr, "rss_after");
    cr_expect_leq(after + LARGE_SIZE + HUGE_SIZE * 9 / 10, before, "RSS %llu KiB -> %llu KiB",
                  (unsigned long long)before >> 10, (unsigned long long)after >> 10);
}

/* With no reclaim thread the trim's caller purges, and a madvise the
 * kernel refuses sets its errno: malloc_trim(0) returned with the purge's
 * ENOMEM (or EINVAL) in errno. */
Test(glibc_malloc, malloc_trim_on_its_caller_leaves_errno_as_it_was, .timeout = 120) {
    const char *vars[] = {"LULL_TEST_TRIM_CALLER_REFUSED=1", "LULL_FAULT=thread_create,purge_nomem",
                          "LULL_CONF=warm_reserve_mb=0,refault_monitor=off", NULL};
    child_run cr;
    reexec_run("test_glibc_malloc", vars, "refused trim on the caller", 60000, &cr);
    reexec_assert_exited_0(&cr, "refused trim on the caller");
    cr_assert_gt(reexec_field(&cr, "refused"), 0, "no purge was refused: %s", cr.out);
    int err = (int)reexec_field(&cr, "errno");
    cr_expect_eq(err, EDOM, "errno %d (%s) after malloc_trim(0)", err, strerror(err));
}

/* The pad is no bound on what goes (lull.h says why). Read in lull's own
 * figures: under ThreadSanitizer the reclaim thread's start and the
 * shadow of the memory the purge walks grow RSS by about the block. */
Test(glibc_malloc, malloc_trim_ignores_its_pad) {
    lull_set_purge_delay_ms(-1);
    char *large = lull_malloc(LARGE_SIZE);
    memset(large, 1, LARGE_SIZE);
    lull_free(large);
    struct lull_mallinfo2 m0 = info();
    cr_expect_eq(trim(SIZE_MAX), 1);
    struct lull_mallinfo2 m1 = info();
    cr_expect_leq(m1.arena + LARGE_SIZE, m0.arena, "arena %zu -> %zu: the block stayed", m0.arena,
                  m1.arena);
}

#ifdef LULL_OVERRIDE
/* glibc's int figures, saturated where glibc's wrap: a huge block of 3 GiB
 * (mapped, never touched) reads as INT_MAX in hblkhd, not as 1 GiB. */
Test(glibc_malloc, mallinfo_saturates_its_int_fields) {
    size_t big = (size_t)3 << 30;
    char *p = lull_malloc(big);
    if (!p) cr_skip_test("no 3 GiB mapping here (%s)", strerror(errno));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
    struct mallinfo m = mallinfo();
#pragma GCC diagnostic pop
    struct mallinfo2 m2 = mallinfo2();
    cr_expect_eq(m.hblkhd, INT_MAX, "hblkhd %d for %zu bytes", m.hblkhd, m2.hblkhd);
    cr_expect_eq(m.hblks, (int)m2.hblks);
    cr_expect_eq(m.uordblks, (int)m2.uordblks, "a figure under 2 GiB is itself");
    lull_free(p);
}
#endif

/* fd 2 into a pipe for fn(), and what it wrote there. */
static void capture_stderr(void (*fn)(void), char *out, size_t cap) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(stderr);
    int saved = dup(2);
    cr_assert_geq(saved, 0);
    dup2(fds[1], 2);
    close(fds[1]);
    fn();
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    size_t len = 0;
    ssize_t n;
    while (len + 1 < cap && (n = read(fds[0], out + len, cap - 1 - len)) > 0)
        len += (size_t)n;
    out[len] = 0;
    close(fds[0]);
}

static void print_stats(void) {
#ifdef LULL_OVERRIDE
    malloc_stats();
#else
    lull_print_stats(-1);
#endif
}

Test(glibc_malloc, malloc_stats_writes_lull_s_summary_on_stderr) {
    char out[8192];
    capture_stderr(print_stats, out, sizeof out);
    cr_expect_not_null(strstr(out, "lull " LULL_VERSION_STRING ": mapped "), "stderr: %s", out);
    cr_expect_not_null(strstr(out, "identity holds"), "stderr: %s", out);
    cr_expect_null(strstr(out, "Arena 0:"), "glibc's summary: %s", out);
}

/* The value of attribute `name` of the first element `element`, or -1. */
static long long attribute(const char *xml, const char *element, const char *name) {
    char open[64], key[64];
    snprintf(open, sizeof open, "<%s ", element);
    snprintf(key, sizeof key, " %s=\"", name);
    const char *e = strstr(xml, open);
    if (!e) return -1;
    const char *end = strchr(e, '>');
    const char *a = strstr(e, key);
    if (!a || a > end) return -1;
    return strtoll(a + strlen(key), NULL, 10);
}

/* Well-formed, for the XML malloc_info writes: elements with quoted
 * attributes and no text, each opened one closed in order. */
static bool well_formed(const char *xml, char *why, size_t n) {
    const char *stack[16];
    size_t depth = 0, roots = 0;
    for (const char *p = xml; *p;) {
        if (*p == '\n') {
            p++;
            continue;
        }
        if (*p != '<') return snprintf(why, n, "text outside a tag at %.20s", p), false;
        const char *end = strchr(p, '>');
        if (!end) return snprintf(why, n, "tag not closed at %.20s", p), false;
        if (p[1] == '/') {
            size_t len = (size_t)(end - p - 2);
            const char *top = depth ? stack[depth - 1] : "";
            if (!depth || strcspn(top, " />") != len || strncmp(top, p + 2, len))
                return snprintf(why, n, "mismatched close at %.20s", p), false;
            depth--;
        } else {
            size_t quotes = 0;
            for (const char *q = p; q < end; q++)
                quotes += *q == '"';
            if (quotes % 2) return snprintf(why, n, "an unquoted value at %.40s", p), false;
            if (!depth) roots++;
            if (end[-1] != '/') {
                if (depth == 16) return snprintf(why, n, "too deep"), false;
                stack[depth++] = p + 1;
            }
        }
        p = end + 1;
    }
    if (depth) return snprintf(why, n, "%zu elements left open", depth), false;
    if (roots != 1) return snprintf(why, n, "%zu root elements", roots), false;
    return true;
}

static int info_xml(int options, FILE *fp) {
#ifdef LULL_OVERRIDE
    return malloc_info(options, fp);
#else
    return lull_malloc_info(options, fp);
#endif
}

Test(glibc_malloc, malloc_info_writes_an_xml_document_of_lull_s_figures) {
    char *huge = lull_malloc(HUGE_SIZE);
    cr_assert_not_null(huge);
    char *buf = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&buf, &len);
    cr_assert_not_null(fp);
    struct lull_mallinfo2 m = lull_mallinfo2();
    cr_assert_eq(info_xml(0, fp), 0);
    cr_assert_eq(fclose(fp), 0);
    char why[128] = "";
    cr_expect(well_formed(buf, why, sizeof why), "%s:\n%s", why, buf);
    cr_expect_not_null(strstr(buf, "<malloc version=\"1\" allocator=\"lull\""), "%s", buf);
    cr_expect_not_null(strstr(buf, "<heap nr=\"0\" node="), "%s", buf);
    cr_expect_eq(attribute(buf, "total type=\"mmap\"", "count"), (long long)m.hblks, "%s", buf);
    cr_expect_eq(attribute(buf, "total type=\"mmap\"", "size"), (long long)m.hblkhd, "%s", buf);
    long long uord = attribute(buf, "mallinfo", "uordblks");
    /* open_memstream's own buffer may have come in between */
    cr_expect(uord >= (long long)m.uordblks - (long long)MiB &&
                  uord <= (long long)m.uordblks + (long long)MiB,
              "uordblks %lld in the XML, %zu from mallinfo2:\n%s", uord, m.uordblks, buf);
    cr_expect_gt(attribute(buf, "accounting", "mapped"), 0, "%s", buf);
    free(buf);
    lull_free(huge);
}

Test(glibc_malloc, malloc_info_refuses_options) {
    errno = 0;
    cr_expect_eq(info_xml(1, stdout), EINVAL);
    cr_expect_eq(errno, EINVAL);
}
