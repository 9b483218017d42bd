/* The sampled heap profile (profile_sample_kb, src/profile.h), end to end:
 * a new process with sampling at 16 KiB allocates from functions of its
 * own (most memory live in hold_most_memory, most bytes allocated and
 * freed in churn, a large block, calloc'd blocks, blocks of a thread that
 * exits and that main frees), dumps with lull_profile_dump and prints
 * the true figures; `go tool pprof` must name the right function first for
 * each sample type, with estimates within 30 % of the truth (at 16 KiB the
 * smallest figure, 4 MiB, rests on about 256 samples: a standard error of
 * 6 %, so 30 % is 4.8 of them; at 64 KiB it failed 1 run in 40),
 * and with none of lull's own frames on top. Also the API's errors. go is
 * required (tests/support/pprof_run.h). The lull_* names, so that the
 * sanitizer builds (where malloc is the sanitizer's) profile too. */
#define _GNU_SOURCE
#include "lull.h"
#include "tests/support/pprof_run.h"
#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

#define MOST_BLOCKS 98304   /* of 256 B: 24 MiB, half freed before the dump */
#define LESS_BLOCKS 65536   /* of 64 B, calloc: 4 MiB */
#define CHURN_PAIRS 1000000 /* of 100 B: 95 MiB allocated, none live */
#define THREAD_BLOCKS 32768 /* of 128 B: 4 MiB, freed by main */
#define LARGE_BYTES (3 * MiB)

static void *most[MOST_BLOCKS], *less[LESS_BLOCKS], *thread_blocks[THREAD_BLOCKS], *large;

/* the compiler must not drop a malloc whose block is not used (gcc drops
 * a calloc stored in a static array nobody reads) */
static void keep(void *p) {
    __asm__ volatile("" ::"r"(p) : "memory");
}

__attribute__((noinline)) static void hold_most_memory(void) {
    for (int i = 0; i < MOST_BLOCKS; i++) {
        most[i] = lull_malloc(256);
        memset(most[i], 1, 256);
    }
}

__attribute__((noinline)) static void hold_less(void) {
    for (int i = 0; i < LESS_BLOCKS; i++)
        keep(less[i] = lull_calloc(1, 64));
}

__attribute__((noinline)) static void churn(void) {
    for (int i = 0; i < CHURN_PAIRS; i++) {
        void *p = lull_malloc(100);
        keep(p);
        lull_free(p);
    }
}

__attribute__((noinline)) static void hold_large(void) {
    large = lull_malloc(LARGE_BYTES);
    memset(large, 2, LARGE_BYTES);
    keep(large);
}

__attribute__((noinline)) static void *allocate_in_thread(void *arg) {
    (void)arg;
    for (int i = 0; i < THREAD_BLOCKS; i++)
        keep(thread_blocks[i] = lull_malloc(128));
    return NULL;
}

__attribute__((constructor(200))) static void scenario(void) {
    const char *out = getenv("LULL_TEST_HEAP_PROFILE");
    if (!out) return;
    hold_most_memory();
    hold_less();
    /* the thread samples while main does: the profile's lock, under TSan */
    pthread_t t;
    if (pthread_create(&t, NULL, allocate_in_thread, NULL) != 0) _exit(2);
    churn();
    pthread_join(t, NULL);
    hold_large();
    for (int i = 0; i < THREAD_BLOCKS; i++)
        lull_free(thread_blocks[i]);
    for (int i = 0; i < MOST_BLOCKS; i += 2)
        lull_free(most[i]);
    /* a directory that does not exist: the error is the open's */
    errno = 0;
    int missing = lull_profile_dump("/nonexistent-dir/heap.pb.gz");
    printf("missing_rc=%d\nmissing_errno=%d\n", missing, errno);
    int rc = lull_profile_dump(out);
    printf("dump_rc=%d\n", rc);
    printf("most_live=%zu\nless_live=%zu\nlarge_live=%zu\nchurn_alloc=%zu\nmost_peak=%zu\n",
           (size_t)(MOST_BLOCKS / 2) * 256, (size_t)LESS_BLOCKS * 64, LARGE_BYTES,
           (size_t)CHURN_PAIRS * 100, (size_t)MOST_BLOCKS * 256);
    fflush(stdout);
    _exit(0);
}

/* ---- the parent ------------------------------------------------------------ */

static char dir[] = "/tmp/lull-heap-profile-XXXXXX";
static char path[sizeof dir + 16], exe[PATH_MAX];
static child_run cr;

static void run_scenario(void) {
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/heap.pb.gz", dir);
    cr_assert_not_null(realpath("/proc/self/exe", exe));
    pprof_env(dir);
    char var[sizeof path + 32];
    snprintf(var, sizeof var, "LULL_TEST_HEAP_PROFILE=%s", path);
    const char *vars[] = {var, "LULL_CONF=profile_sample_kb=16", NULL};
    reexec_run("test_heap_profile_scenario", vars, "heap profile", 120000, &cr);
    reexec_assert_exited_0(&cr, "heap profile");
    cr_assert_eq(reexec_field(&cr, "dump_rc"), 0, "lull_profile_dump failed:\n%s", cr.err);
}

static void remove_dir(void) {
    char cmd[sizeof dir + 16];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("%s failed", cmd);
}

TestSuite(heap_profile, .init = run_scenario, .fini = remove_dir);

typedef struct {
    char name[256];
    double flat; /* bytes or objects */
} top_row;

/* The first rows of `-top` for a sample index, values in bytes (B) or as
 * counts. */
static int top_rows(const char *index, top_row *rows, int max, char **text) {
    char args[128];
    snprintf(args, sizeof args, "-top -nodecount=20 -sample_index=%s -unit=B", index);
    char *out = pprof_run(args, exe, path);
    *text = out;
    const char *l = strstr(out, "flat%");
    cr_assert_not_null(l, "no table in the output of %s:\n%s", args, out);
    int n = 0;
    for (l = strchr(l, '\n'); l && n < max; l = strchr(l + 1, '\n')) {
        double v;
        char name[256];
        if (sscanf(l + 1, "%lf%*[A-Za-z] %*s %*s %*s %*s %255s", &v, name) != 2) continue;
        snprintf(rows[n].name, sizeof rows[n].name, "%s", name);
        rows[n].flat = v;
        n++;
    }
    return n;
}

static const top_row *row_named(const top_row *rows, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(rows[i].name, name) == 0) return &rows[i];
    return NULL;
}

static void expect_near(const top_row *rows, int n, const char *name, const char *truth_key,
                        const char *index, const char *text) {
    const top_row *r = row_named(rows, n, name);
    cr_assert_not_null(r, "%s: no row for %s:\n%s", index, name, text);
    double truth = (double)reexec_field(&cr, truth_key);
    cr_expect(r->flat >= truth * 0.7 && r->flat <= truth * 1.3,
              "%s: %s estimated at %.0f, the truth is %.0f (more than 30 %% off):\n%s", index, name,
              r->flat, truth, text);
}

/* No frame of lull's own is a function's flat owner. */
static void expect_no_lull_on_top(const top_row *rows, int n, const char *text) {
    for (int i = 0; i < n; i++)
        cr_expect(strncmp(rows[i].name, "lull_", 5) != 0 && strcmp(rows[i].name, "malloc") != 0 &&
                      strcmp(rows[i].name, "calloc") != 0 && strcmp(rows[i].name, "alloc_in_heap"),
                  "lull's frame %s holds memory:\n%s", rows[i].name, text);
}

Test(heap_profile, inuse_space_names_the_function_that_holds_most) {
    top_row rows[20];
    char *text;
    int n = top_rows("inuse_space", rows, 20, &text);
    cr_assert_geq(n, 1, "%s", text);
    cr_expect_str_eq(rows[0].name, "hold_most_memory", "the top of inuse_space:\n%s", text);
    expect_near(rows, n, "hold_most_memory", "most_live", "inuse_space", text);
    expect_near(rows, n, "hold_less", "less_live", "inuse_space", text);
    expect_near(rows, n, "hold_large", "large_live", "inuse_space", text);
    /* the thread's blocks were freed by main: at most a stray estimate */
    const top_row *t = row_named(rows, n, "allocate_in_thread");
    cr_expect(!t || t->flat < 0.1 * (double)reexec_field(&cr, "less_live"),
              "allocate_in_thread still holds %.0f bytes:\n%s", t ? t->flat : 0.0, text);
    cr_expect_null(row_named(rows, n, "churn"), "churn holds memory:\n%s", text);
    expect_no_lull_on_top(rows, n, text);
    free(text);
}

Test(heap_profile, alloc_space_names_the_function_that_allocated_most) {
    top_row rows[20];
    char *text;
    int n = top_rows("alloc_space", rows, 20, &text);
    cr_assert_geq(n, 1, "%s", text);
    cr_expect_str_eq(rows[0].name, "churn", "the top of alloc_space:\n%s", text);
    expect_near(rows, n, "churn", "churn_alloc", "alloc_space", text);
    cr_expect_not_null(row_named(rows, n, "allocate_in_thread"), "%s", text);
    expect_no_lull_on_top(rows, n, text);
    free(text);
}

Test(heap_profile, peak_space_keeps_the_peak) {
    top_row rows[20];
    char *text;
    int n = top_rows("peak_space", rows, 20, &text);
    cr_assert_geq(n, 1, "%s", text);
    cr_expect_str_eq(rows[0].name, "hold_most_memory", "the top of peak_space:\n%s", text);
    /* the peak is recorded within 1/16 of the real one: the 24 MiB before
     * half of them were freed, not the 12 MiB left */
    expect_near(rows, n, "hold_most_memory", "most_peak", "peak_space", text);
    free(text);
}

Test(heap_profile, dump_errors) {
    cr_expect_eq(reexec_field(&cr, "missing_rc"), (uint64_t)-1);
    cr_expect_eq(reexec_field(&cr, "missing_errno"), ENOENT);
    /* this process samples nothing: profiling is off */
    errno = 0;
    cr_expect_eq(lull_profile_dump("/tmp/never-written"), -1);
    cr_expect_eq(errno, EINVAL);
    cr_expect_neq(access("/tmp/never-written", F_OK), 0);
}
