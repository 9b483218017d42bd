/* The guest test program: a static binary that is /init of a qemu guest
 * with two NUMA nodes (tests/numa_guest/run.sh boots it).
 *
 * Checks live in check_*.c files of this folder; build.sh links every one
 * of them. A check is a function registered with GUEST_CHECK; each runs in
 * its own forked child (a crash or a hang fails that check only, never the
 * guest's init), with a time limit. It returns GUEST_PASS, GUEST_FAIL or
 * GUEST_SKIP and says why with guest_detail() (the last one is shown on the
 * CHECK line) and guest_info() (extra lines).
 *
 * Every check belongs to a group, the GUEST_GROUP of its file ("numa"
 * unless the file defines another before including this header; the
 * check_kernel_*.c files are "kernel"). A boot runs the groups named by
 * lull_guest.group= (a comma list; "all", or no such parameter, runs every
 * group), or only the checks named by lull_guest.only= (any group).
 *
 * Serial console protocol, parsed by run.sh (lines start with "LULL-GUEST: "):
 *   LULL-GUEST: BEGIN kernel=<release> cpus=<n> checks=<n>
 *   LULL-GUEST: INFO <check>: <text>
 *   LULL-GUEST: CHECK <name> PASS|FAIL|SKIP <ms>ms <detail>
 *   LULL-GUEST: SUMMARY passed=<n> failed=<n> skipped=<n> uptime_ms=<n>
 *   LULL-GUEST: END
 */
#ifndef LULL_GUEST_H
#define LULL_GUEST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum { GUEST_PASS = 0, GUEST_FAIL = 1, GUEST_SKIP = 77 };

#ifndef GUEST_GROUP
#define GUEST_GROUP "numa"
#endif

struct guest_check {
    const char *name;
    int (*run)(void);
    int timeout_s;    /* 0: the default (60 s) */
    const char *file; /* checks run in (file name, line) order */
    int line;
    const char *group; /* GUEST_GROUP of its file */
};

/* Register `static int name(void)` as a check. */
#define GUEST_CHECK_TIMEOUT(name, seconds)                                                         \
    static int name(void);                                                                         \
    static const struct guest_check guest_check_##name                                             \
        __attribute__((used, section("guest_checks"), aligned(sizeof(void *)))) = {                \
            #name, name, seconds, __FILE__, __LINE__, GUEST_GROUP};                                \
    static int name(void)
#define GUEST_CHECK(name) GUEST_CHECK_TIMEOUT(name, 0)

/* The detail shown on the CHECK line (the last call wins). */
void guest_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* The detail as it stands ("" if none): what a sub-check said last, for
 * a check that reads a figure back from it. */
const char *guest_detail_text(void);
/* An INFO line now. */
void guest_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* guest_detail() and return GUEST_FAIL when cond is false. */
#define GUEST_REQUIRE(cond, ...)                                                                   \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            guest_detail(__VA_ARGS__);                                                             \
            return GUEST_FAIL;                                                                     \
        }                                                                                          \
    } while (0)

/* Value of "lull_guest.<key>=" on the kernel command line, copied into buf;
 * NULL when absent. Outside a guest (not PID 1), the environment variable
 * LULL_GUEST_CMDLINE, when set, stands for the command line: a quick try
 * on the host is `LULL_GUEST_CMDLINE="lull_guest.group=kernel" OUT/init`. */
const char *guest_param(const char *key, char *buf, size_t len);

/* Pin the calling thread to one CPU (and wait until it runs there). */
bool guest_pin_cpu(int cpu);
/* Run fn(arg) on a new thread pinned to cpu; returns fn's result (or
 * GUEST_FAIL when the thread cannot be created or pinned). */
int guest_on_cpu(int cpu, int (*fn)(void *), void *arg);

/* Anonymous private mapping (NULL on failure), and writing one byte per
 * page to fault every page in. */
void *guest_map(size_t len);
void guest_touch(void *p, size_t len);

/* Milliseconds of CLOCK_MONOTONIC. */
uint64_t guest_now_ms(void);

/* ---- sub-checks: a part of a check run in a fresh process ----
 *
 * A check that needs a fresh process (lull reads LULL_CONF and LULL_FAULT
 * once, in its constructor, and the /init process itself started lull
 * before it had mounted /sys) runs a sub-check: this program re-executed
 * (/proc/self/exe) as "/init lull-sub NAME FD" with the environment given.
 * A constructor of guest_sub.c (priority 1000, after lull's own at 101)
 * runs sub-check NAME there and exits before main. Its guest_sub_info()
 * and guest_sub_detail() lines, and whatever it writes to stderr (lull's
 * own messages: "lull: ..."), come back through the pipe FD; its result is
 * the exit status. */
struct guest_sub {
    const char *name;
    int (*run)(void);
};

/* Register `int fn(void)` as the sub-check called name (a string, unique
 * over the program). */
#define GUEST_SUB(name, fn)                                                                        \
    static const struct guest_sub guest_sub_##fn                                                   \
        __attribute__((used, section("guest_subs"), aligned(sizeof(void *)))) = {name, fn}

/* In a check's process: run sub-check name with the environment env (a
 * NULL-terminated list of "KEY=value", nullable), relay its INFO lines and
 * its detail, and return its result. */
int guest_sub_run(const char *name, const char *const *env);

/* In a sub-check: an INFO line, and the detail (the last one wins). In a
 * check's own process they are guest_info() and guest_detail(). */
void guest_sub_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void guest_sub_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* guest_sub_detail() and return GUEST_FAIL when cond is false. */
#define GUEST_SUB_REQUIRE(cond, ...)                                                               \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            guest_sub_detail(__VA_ARGS__);                                                         \
            return GUEST_FAIL;                                                                     \
        }                                                                                          \
    } while (0)

#endif
