/* The heap profile's tables (src/profile.c) are mapped at the first
 * sample, all or none: a sample that an address space limit refuses one
 * of them is dropped and holds none of the others. The tables mapped before
 * the one refused were kept, and the next sample mapped them all anew:
 * 2.6 MiB leaked a dropped sample while the limit left room for them.
 * The sample is recorded directly (lull_profile_sampled), in a process
 * that samples nothing by itself (no profile_sample_kb), so that the
 * sample under the limit is the tables' first. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/profile.h"

#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <sys/resource.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

Test(profile_tables_enomem, a_sample_refused_its_tables_holds_none_of_them) {
    lull_set_purge_delay_ms(-1); /* no reclaim work meanwhile */
    char *p = lull_malloc(64);
    cr_assert_not_null(p);
    struct rlimit old;
    cr_assert_eq(getrlimit(RLIMIT_AS, &old), 0);
    /* room for the stacks' table and its index (2.6 MiB), not for the
     * sampled blocks' (4 MiB) */
    size_t before = vm_bytes();
    struct rlimit lim = {before + 3 * MiB, old.rlim_max};
    cr_assert_eq(setrlimit(RLIMIT_AS, &lim), 0);
    lull_profile_sampled(p, 64, 64);
    size_t refused = vm_bytes();
    cr_assert_eq(setrlimit(RLIMIT_AS, &old), 0);
    /* the stack walk's own cache (64 KiB) may be mapped on the way */
    cr_assert_leq(refused, before + 128 * KiB, "the refused sample holds %zu KiB of address space",
                  (refused - before) / KiB);
    lull_profile_sampled(p, 64, 64); /* the limit lifted: recorded */
    lull_profile_forget(p);
    lull_free(p);
}
