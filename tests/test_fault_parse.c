/* LULL_FAULT (base/fault.h), a test hook read once at start, reports an
 * item that arms nothing, as a bad configuration value is reported: a
 * misspelt name (or a count that is no number) armed nothing silently,
 * and the test it was written for passed without its fault. */
#include "lull.h"
#include "base/fault.h"
#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

static void parse_and_check(void *spec) {
    lull_fault_parse(spec);
    bool armed_as_asked =
        lull_fault_armed[LULL_FAULT_MMAP] == 2 && lull_fault_armed[LULL_FAULT_SHM_OPEN] == -1 &&
        lull_fault_armed[LULL_FAULT_URING_CQE] == 0 && lull_fault_armed[LULL_FAULT_COLLAPSE] == 0;
    for (int p = 0; p < LULL_FAULT_COUNT; p++)
        lull_fault_arm((lull_fault_point)p, 0);
    if (!armed_as_asked) abort();
}

static int count_of(const char *text, const char *word) {
    int n = 0;
    for (const char *at = strstr(text, word); at; at = strstr(at + 1, word))
        n++;
    return n;
}

Test(fault_parse, an_item_that_arms_nothing_is_reported_and_the_others_are_armed) {
    child_result r;
    run_in_child(parse_and_check, "mmap:2,nosuch,uring_cqe:x,,shm_open,collapse:3y", &r);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0,
              "the known items were not armed as asked (status %#x): %s", r.status, r.err);
    cr_assert_eq(count_of(r.err, "LULL_FAULT"), 3, "three items arm nothing: %s", r.err);
    cr_assert_not_null(strstr(r.err, "'nosuch' ignored"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "'uring_cqe:x' ignored"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "'collapse:3y' ignored"), "%s", r.err);
    cr_assert_not_null(strstr(r.err, "thread_create"), "the message names the points: %s", r.err);
}

Test(fault_parse, known_items_and_an_empty_value_say_nothing) {
    child_result r;
    run_in_child(parse_and_check, "mmap:2,shm_open", &r);
    cr_assert(WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0, "%s", r.err);
    cr_assert_eq(r.err_len, 0, "a message for known items: %s", r.err);
    lull_fault_parse("");
    for (int p = 0; p < LULL_FAULT_COUNT; p++)
        cr_assert_eq(lull_fault_armed[p], 0);
}
