/* The kernel checks (tests/numa_guest/check_kernel_*.c: purge backends and
 * their fallbacks, the refault monitor, THP and MADV_COLLAPSE, the
 * accounting identity, no purge system call on request threads, fault
 * injection) in a qemu guest booting Debian 12's 6.1 PREEMPT_RT
 * kernel (linux-image-rt-amd64, in CACHE/kernel-rt), through
 * tests/numa_guest/run.sh --group kernel; each check's line says which
 * mechanism lull got there (test_kernel_generic.c boots the generic kernel).
 * Skipped in a build without a liblull.a to link; skipping and CI:
 * tests/support/guest_boot.h. 512 MiB a node: below 512 MiB in all the
 * kernel turns THP off. LULL_KERNEL_GUEST_ARGS adds run.sh arguments (for
 * example "--only kernel_thp"). */
#include "tests/support/guest_boot.h"

#include <criterion/criterion.h>

Test(kernel_guest, rt, .timeout = 590) {
    guest_boot_run(&(struct guest_boot){
        .what = "kernel guest (rt)",
        .out_name = "kernel-guest-rt",
        .args = {"--group", "kernel", "--flavour", "rt", "--mem", "512", NULL},
        .args_env = "LULL_KERNEL_GUEST_ARGS",
        .need_lib = true,
    });
}
