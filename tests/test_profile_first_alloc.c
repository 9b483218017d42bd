/* The heap profile's stack of a process's very first allocation: lull
 * reads its configuration (profile_sample_kb) there, after the slow path
 * has looked whether profiling is on, so that allocation ran without the
 * boundary below which the stack is lull's own. Sampled (a block of 1 MiB
 * at 16 KiB is, all but surely), its stack began with lull_profile_sampled
 * and alloc_in_heap, which pprof named as the holders of its memory
 * (session 29's review: a program whose first malloc is a large buffer).
 * go is required (tests/support/pprof_run.h). */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include "lull.h"
#include "tests/support/pprof_run.h"
#include "tests/support/reexec.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIRST_BYTES ((size_t)1 << 20)

/* ---- the child: its first allocation through lull ---------------------- */

__attribute__((noinline)) static void *first_allocation(void) {
    void *p = lull_malloc(FIRST_BYTES);
    __asm__ volatile("" ::"r"(p) : "memory");
    return p;
}

/* before Criterion (and anything else of this program) allocates */
__attribute__((constructor(101))) static void first_alloc_role(void) {
    const char *path = getenv("LULL_TEST_FIRST_ALLOC");
    if (!path) return;
    void *p = first_allocation();
    int rc = lull_profile_dump(path);
    printf("dump_rc=%d\nfirst=%d\n", rc == 0 ? 0 : errno, p != NULL);
    fflush(stdout);
    _exit(0);
}

/* ---- the parent ------------------------------------------------------------ */

Test(profile_first_alloc, the_first_allocation_has_no_lull_frame_on_top, .timeout = 120) {
    char dir[] = "/tmp/lull-first-alloc-XXXXXX", path[64], exe[PATH_MAX], var[96];
    cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
    snprintf(path, sizeof path, "%s/heap.pb.gz", dir);
    cr_assert_not_null(realpath("/proc/self/exe", exe));
    pprof_env(dir);
    snprintf(var, sizeof var, "LULL_TEST_FIRST_ALLOC=%s", path);
    const char *vars[] = {var, "LULL_CONF=profile_sample_kb=16", NULL};
    child_run cr;
    reexec_run("test_profile_first_alloc_child", vars, "first allocation", 60000, &cr);
    reexec_assert_exited_0(&cr, "first allocation");
    cr_assert_eq(reexec_field(&cr, "dump_rc"), 0, "lull_profile_dump failed:\n%s", cr.err);
    cr_assert_eq(reexec_field(&cr, "first"), 1);
    char *out = pprof_run("-top -nodecount=10 -sample_index=alloc_space", exe, path);
    cr_expect(strstr(out, "first_allocation") != NULL, "no sample names first_allocation:\n%s",
              out);
    cr_expect(strstr(out, "lull_profile_sampled") == NULL && strstr(out, "alloc_in_heap") == NULL,
              "lull's own frames are in the first allocation's stack:\n%s", out);
    free(out);
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) cr_log_warn("%s failed", cmd);
}
