/* purge_mode=auto purges with MADV_FREE only while memory is not short
 * (docs/configuration.md, docs/refault.md): the policy had the switch
 * (lull_policy_set_memory_short, test_policy.c) but nothing ever threw
 * it, so a machine or a container short of memory still got MADV_FREE,
 * whose pages stay in RSS and in the cgroup's usage. The reclaim thread
 * now looks (reclaim/memory_short.h): here at the two files' texts, and
 * at the look reaching the policy through the reclaim thread's ticks. */
#define _GNU_SOURCE
#include "lull.h"
#include "reclaim/memory_short.h"
#include "reclaim/policy.h"
#include "reclaim/reclaim.h"

#include <criterion/criterion.h>
#include <stdatomic.h>
#include <time.h>

Test(memory_short, meminfo) {
    cr_assert(lull_meminfo_short("MemTotal:       16000000 kB\n"
                                 "MemFree:          100000 kB\n"
                                 "MemAvailable:     900000 kB\n"));
    cr_assert(!lull_meminfo_short("MemTotal:       16000000 kB\n"
                                  "MemFree:          100000 kB\n"
                                  "MemAvailable:    1100000 kB\n"));
    /* before Linux 3.14: no MemAvailable, no answer */
    cr_assert(!lull_meminfo_short("MemTotal:       16000000 kB\nMemFree:  10 kB\n"));
    cr_assert(!lull_meminfo_short(""));
}

Test(memory_short, cgroup) {
    cr_assert(!lull_cgroup_short("1000000\n", "max\n"));
    cr_assert(lull_cgroup_short("1000000\n", "1040000\n"));
    cr_assert(!lull_cgroup_short("900000\n", "1040000\n"));
    cr_assert(!lull_cgroup_short("", "1040000\n"));
    cr_assert(!lull_cgroup_short("5\n", "0\n"));
    /* a limit past 64 bits is no limit (it wrapped to 1: short) */
    cr_assert(!lull_cgroup_short("1000000\n", "18446744073709551617\n"));
}

static atomic_bool fake_short;

static bool fake_probe(void) {
    return atomic_load(&fake_short);
}

/* The reclaim thread's ticks until the policy's switch reads `want`; a
 * look is due once a period (250 ms): 20 s is only the failure's bound. */
static bool policy_turns(bool want) {
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    do {
        if (!lull_reclaim_now()) return false;
        if (__atomic_load_n(&lull_the_policy.memory_short, __ATOMIC_RELAXED) == want) return true;
        struct timespec pause = {0, 5000000};
        nanosleep(&pause, NULL);
        clock_gettime(CLOCK_MONOTONIC, &t);
    } while (t.tv_sec - t0.tv_sec < 20);
    return false;
}

Test(memory_short, reaches_the_policy) {
    lull_memory_short_probe = fake_probe;
    cr_assert(lull_configure("purge_mode", "auto"));
    cr_assert(lull_configure("purge_delay_ms", "auto"));
    lull_free(lull_malloc(64));
    atomic_store(&fake_short, true);
    cr_assert(policy_turns(true), "memory short, but the purge policy was never told");
    atomic_store(&fake_short, false);
    cr_assert(policy_turns(false), "memory no longer short, but the purge policy still thinks so");
}
