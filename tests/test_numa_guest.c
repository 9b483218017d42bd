/* The two-node NUMA system test: boots a qemu guest (TCG) whose /init is
 * tests/numa_guest's static test program, through tests/numa_guest/run.sh,
 * with the NUMA checks (run.sh's default group), and passes when every
 * guest check passes. Skipping, CI and the liblull.a linked:
 * tests/support/guest_boot.h. Without a liblull.a (LULL_OVERRIDE off,
 * sanitizer builds) only the numa/ checks run. LULL_NUMA_GUEST_ARGS adds
 * arguments to run.sh (for example "--only topology,lull_local"). */
#include "tests/support/guest_boot.h"

#include <criterion/criterion.h>

Test(numa_guest, two_nodes_in_qemu, .timeout = 590) {
    guest_boot_run(&(struct guest_boot){
        .what = "NUMA guest",
        .out_name = "numa-guest",
        .args = {"--group", "numa", NULL},
        .args_env = "LULL_NUMA_GUEST_ARGS",
    });
}
