/* Boot the qemu guest of tests/numa_guest/ (through its run.sh) from a
 * Criterion test, and pass when every guest check passes: the body of
 * test_numa_guest and of the kernel tests (test_kernel_generic,
 * test_kernel_rt).
 *
 * Skipped only when qemu-system-x86_64 or the guest kernel image is not
 * installed (.ci/numa-guest-deps.sh installs them). In CI (CI=true), or
 * with LULL_REQUIRE_NUMA_GUEST=1, a missing dependency fails the test
 * instead, so a CI machine without them cannot pass by skipping;
 * LULL_REQUIRE_NUMA_GUEST=0 turns that off.
 *
 * The guest program is linked with this build's liblull.a (run.sh --lib).
 * A build whose malloc is not lull's (LULL_OVERRIDE off, sanitizer builds)
 * has none to link: there the guest runs the numa/ checks alone, and a
 * boot that needs the allocator (need_lib) is skipped, whatever CI says.
 * LULL_NUMA_GUEST_LIB names another liblull.a, or "none". */
#ifndef LULL_TESTS_GUEST_BOOT_H
#define LULL_TESTS_GUEST_BOOT_H

#include <stdbool.h>

struct guest_boot {
    const char *what;     /* in messages: "NUMA guest", "kernel guest (rt)" */
    const char *out_name; /* BUILD/out_name: the guest's build and log dir */
    const char *args[12]; /* more run.sh arguments, NULL-terminated */
    const char *args_env; /* an environment variable with more (split at spaces) */
    bool need_lib;        /* skip without a liblull.a to link */
};

/* Boot, show the guest's report on stderr (ctest --output-on-failure or -V
 * shows it) and assert on the result. */
void guest_boot_run(const struct guest_boot *b);

#endif
