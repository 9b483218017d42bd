/* The NUMA guest test program: a static binary that is /init of a qemu
 * guest with two NUMA nodes (tests/numa_guest/run.sh boots it).
 *
 * Checks live in check_*.c files of this folder; build.sh links every one
 * of them. A check is a function registered with GUEST_CHECK; each runs in
 * its own forked child (a crash or a hang fails that check only, never the
 * guest's init), with a time limit. It returns GUEST_PASS, GUEST_FAIL or
 * GUEST_SKIP and says why with guest_detail() (the last one is shown on the
 * CHECK line) and guest_info() (extra lines).
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

struct guest_check {
    const char *name;
    int (*run)(void);
    int timeout_s;    /* 0: the default (60 s) */
    const char *file; /* checks run in (file name, line) order */
    int line;
};

/* Register `static int name(void)` as a check. */
#define GUEST_CHECK_TIMEOUT(name, seconds)                                                         \
    static int name(void);                                                                         \
    static const struct guest_check guest_check_##name                                             \
        __attribute__((used, section("guest_checks"), aligned(sizeof(void *)))) = {                \
            #name, name, seconds, __FILE__, __LINE__};                                             \
    static int name(void)
#define GUEST_CHECK(name) GUEST_CHECK_TIMEOUT(name, 0)

/* The detail shown on the CHECK line (the last call wins). */
void guest_detail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
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
 * NULL when absent. */
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

#endif
