/* The configuration (base/config.c) given hostile or careless input:
 *
 *  - numbers: out of range (also past what a long or an unsigned holds),
 *    with a space or a sign around them: refused with one message naming
 *    the key and the value, and the value in force kept;
 *  - a key given twice whose later value is bad: the earlier value stays,
 *    and the message says so (not "using the default");
 *  - a start-up configuration with thousands of problems: the first 8
 *    messages and a count, not one line each;
 *  - a setuid or setgid program (secure mode, AT_SECURE): lull takes no
 *    configuration from the environment.
 *
 * The start-up cases run in a new process of this program
 * (tests/support/reexec.h) whose constructor prints the configuration in
 * force as key=value lines. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/config.h"
#include "base/fault.h"

#include "tests/support/reexec.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#ifndef LULL_BUILD_DIR
#define LULL_BUILD_DIR "."
#endif

extern char **environ;

/* ------------------------------------------------------------ the probe */

/* With LULL_TEST_CONFIG_SECURE=PATH: execute PATH (a setgid copy of this
 * program) with the same environment, minus that variable, and with each
 * variable SECURE_LULL_x renamed LULL_x (this process, a lull process too,
 * must not take them itself). */
static void secure_trampoline(const char *path) {
    static char *envp[512];
    size_t n = 0;
    for (char **e = environ; *e && n < 511; e++)
        if (strncmp(*e, "SECURE_LULL_", 12) == 0)
            envp[n++] = *e + 7;
        else if (strncmp(*e, "LULL_TEST_CONFIG_SECURE=", 24) != 0)
            envp[n++] = *e;
    envp[n] = NULL;
    char *const argv[] = {"test_config_secure_probe", NULL};
    execve(path, argv, envp);
    dprintf(2, "execve %s: %s\n", path, strerror(errno));
    _exit(127);
}

/* With LULL_TEST_CONFIG_PROBE set: print the configuration in force. */
__attribute__((constructor(200))) static void config_probe(void) {
    const char *secure = getenv("LULL_TEST_CONFIG_SECURE");
    if (secure) secure_trampoline(secure);
    if (!getenv("LULL_TEST_CONFIG_PROBE")) return;
    void *p = lull_malloc(16); /* lull is initialised: the environment is read */
    lull_free(p);
    dprintf(1,
            "at_secure=%lu\ndelay=%ld\nwarm_mb=%zu\ncpus_set=%d\ncpu_count=%d\nnuma_nodes=%llu\n"
            "fault_numa=%d\n",
            getauxval(AT_SECURE), lull_purge_delay_ms(), lull_config.warm_reserve_bytes >> 20,
            (int)lull_config.reclaim_cpus_set, CPU_COUNT(&lull_config.reclaim_cpus),
            (unsigned long long)lull_config.numa_nodes,
            atomic_load(&lull_fault_armed[LULL_FAULT_NUMA]) != 0);
    _exit(0);
}

static void probe(const char *label, const char *const *vars, child_run *cr) {
    const char *all[10] = {"LULL_TEST_CONFIG_PROBE=1"};
    size_t n = 1;
    for (; vars[n - 1]; n++)
        all[n] = vars[n - 1];
    all[n] = NULL;
    reexec_run("test_config_probe", all, label, 60000, cr);
    reexec_assert_exited_0(cr, label);
}

/* Lines of s that start with prefix. */
static int lines_starting(const char *s, const char *prefix) {
    int n = 0;
    for (const char *l = s; l && *l;) {
        if (!strncmp(l, prefix, strlen(prefix))) n++;
        l = strchr(l, '\n');
        if (l) l++;
    }
    return n;
}

/* lull_configure(key, value) with its stderr in err. */
static bool configure(const char *key, const char *value, char *err, size_t len) {
    fflush(stderr);
    int m = memfd_create("stderr", MFD_CLOEXEC), saved = dup(STDERR_FILENO);
    cr_assert(m >= 0 && saved >= 0);
    cr_assert_geq(dup2(m, STDERR_FILENO), 0);
    bool ok = lull_configure(key, value);
    dup2(saved, STDERR_FILENO);
    close(saved);
    ssize_t n = pread(m, err, len - 1, 0);
    err[n > 0 ? n : 0] = '\0';
    close(m);
    return ok;
}

#define assert_contains(hay, needle)                                                               \
    cr_assert(strstr((hay), (needle)) != NULL, "expected \"%s\" in:\n%s", (needle), (hay))

/* --------------------------------------------------------------- numbers */

/* A number is decimal digits (a leading '-' for -1): anything else, and any
 * value outside the key's range, is refused with one message and the value
 * in force stays. */
Test(config, numbers_out_of_range_or_with_spaces_are_refused) {
    static const struct {
        const char *key, *good, *bad;
    } cases[] = {
        {"purge_delay_ms", "250", "99999999999999999999"},
        {"purge_delay_ms", "250", "9223372036854775808"},
        {"purge_delay_ms", "250", "4294967295"}, /* used to wrap to "purge at once" */
        {"purge_delay_ms", "250", "4294967296"},
        {"purge_delay_ms", "250", "86400001"},
        {"purge_delay_ms", "250", "-3"},
        {"purge_delay_ms", "250", "-2"}, /* was taken as auto: only -1 is documented */
        {"purge_delay_ms", "250", " 100"},
        {"purge_delay_ms", "250", "100 "},
        {"purge_delay_ms", "250", "+100"},
        {"purge_delay_ms", "250", "0x10"},
        {"purge_delay_ms", "250", "1e3"},
        {"purge_delay_ms", "250", "-"},
        {"warm_reserve_mb", "7", " 5"},
        {"warm_reserve_mb", "7", "5 "},
        {"warm_reserve_mb", "7", "\t5"},
        {"warm_reserve_mb", "7", "+5"},
        {"warm_reserve_mb", "7", "18446744073709551621"},
        {"huge_cache_mb", "9", " 1"},
        {"huge_cache_idle_ms", "11", " 1"},
        {"huge_cache_idle_ms", "11", "-0"},
    };
    char err[1024], want[128];
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        cr_assert(configure(cases[k].key, cases[k].good, err, sizeof err), "%s=%s: %s",
                  cases[k].key, cases[k].good, err);
        cr_assert_str_eq(err, "");
        long before = lull_purge_delay_ms();
        size_t warm = lull_config.warm_reserve_bytes, hc = lull_config.huge_cache_bytes;
        long idle = lull_config.huge_cache_idle_ms;
        bool ok = configure(cases[k].key, cases[k].bad, err, sizeof err);
        cr_assert_not(ok, "%s='%s' was accepted", cases[k].key, cases[k].bad);
        cr_assert_eq(lines_starting(err, "lull:"), 1, "%s='%s': %s", cases[k].key, cases[k].bad,
                     err);
        snprintf(want, sizeof want, "'%s' for %s", cases[k].bad, cases[k].key);
        assert_contains(err, want);
        cr_assert_eq(lull_purge_delay_ms(), before);
        cr_assert_eq(lull_config.warm_reserve_bytes, warm);
        cr_assert_eq(lull_config.huge_cache_bytes, hc);
        cr_assert_eq(lull_config.huge_cache_idle_ms, idle);
    }
    /* the bounds themselves are fine */
    cr_assert(configure("purge_delay_ms", "86400000", err, sizeof err), "%s", err);
    cr_assert_eq(lull_purge_delay_ms(), 86400000);
    cr_assert(configure("purge_delay_ms", "-1", err, sizeof err), "%s", err);
    cr_assert_eq(lull_purge_delay_ms(), -1);
    cr_assert(configure("purge_delay_ms", "0", err, sizeof err), "%s", err);
    cr_assert_eq(lull_purge_delay_ms(), 0);
    cr_assert(configure("warm_reserve_mb", "1048576", err, sizeof err), "%s", err);
    cr_assert(configure("warm_reserve_mb", "0", err, sizeof err), "%s", err);
}

/* CPU and node lists: a number past what the list can hold is refused, not
 * wrapped (4294967297 used to mean CPU 1, 4294967296 node 0). */
Test(config, lists_with_numbers_past_their_range_are_refused, .timeout = 120) {
    child_run cr;
    const char *vars[] = {"LULL_CONF=reclaim_cpu=4294967297,numa_nodes=4294967296", NULL};
    probe("overflowing lists", vars, &cr);
    cr_assert_eq(reexec_field(&cr, "cpus_set"), 0, "reclaim_cpu=4294967297 was taken: %s", cr.out);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 0, "numa_nodes=4294967296 was taken");
    cr_assert_eq(lines_starting(cr.err, "lull:"), 2, "stderr: %s", cr.err);
    assert_contains(cr.err, "'4294967297' for reclaim_cpu");
    assert_contains(cr.err, "'4294967296' for numa_nodes");

    const char *range[] = {"LULL_RECLAIM_CPU=0-4294967297", NULL};
    probe("overflowing range", range, &cr);
    cr_assert_eq(reexec_field(&cr, "cpus_set"), 0, "reclaim_cpu=0-4294967297 was taken");
    cr_assert_eq(lines_starting(cr.err, "lull:"), 1, "stderr: %s", cr.err);
    assert_contains(cr.err, "LULL_RECLAIM_CPU");

    const char *good[] = {"LULL_CONF=reclaim_cpu=0,numa_nodes=0-1", NULL};
    probe("good lists", good, &cr);
    cr_assert_eq(reexec_field(&cr, "cpus_set"), 1);
    cr_assert_eq(reexec_field(&cr, "cpu_count"), 1);
    cr_assert_eq(reexec_field(&cr, "numa_nodes"), 3);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 0, "stderr: %s", cr.err);
}

/* A list that ends in a separator, and a counter page named "." or "..",
 * are refused when the configuration is read, with one message naming the
 * value, and the default kept: "reclaim_cpu=3:" was taken as CPU 3, and
 * the page names passed the check, then failed when the page was made
 * ("not valid"), a second message and no page (session 22's review). */
Test(config, trailing_separators_and_dot_page_names_are_refused, .timeout = 120) {
    static const char *const bad[] = {"LULL_CONF=reclaim_cpu=0:", "LULL_CONF=reclaim_cpu=0+1+",
                                      "LULL_CONF=numa_nodes=0:", "LULL_CONF=counter_page=.",
                                      "LULL_CONF=counter_page=.."};
    static const char *const value[] = {"'0:'", "'0+1+'", "'0:'", "'.'", "'..'"};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        child_run cr;
        const char *vars[] = {bad[k], NULL};
        probe(bad[k], vars, &cr);
        cr_assert_eq(lines_starting(cr.err, "lull:"), 1, "%s: stderr: %s", bad[k], cr.err);
        assert_contains(cr.err, value[k]);
        cr_assert_eq(reexec_field(&cr, "cpus_set"), 0, "%s: a CPU list was taken", bad[k]);
        cr_assert_eq(reexec_field(&cr, "numa_nodes"), 0, "%s: a node list was taken", bad[k]);
    }
}

/* ------------------------------------------------------------ repeats */

/* A key given twice: the last good value wins. A later bad value keeps the
 * earlier one, and the message says which (it used to say "using the
 * default" while the earlier value stayed in force). */
Test(config, a_bad_repeat_keeps_the_earlier_value_and_says_so, .timeout = 120) {
    child_run cr;
    const char *twice[] = {"LULL_CONF=purge_delay_ms=100,purge_delay_ms=oops", NULL};
    probe("repeat in LULL_CONF", twice, &cr);
    cr_assert_eq(reexec_field(&cr, "delay"), 100);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 1, "stderr: %s", cr.err);
    assert_contains(cr.err, "'oops'");
    assert_contains(cr.err, "keeping purge_delay_ms=100 from LULL_CONF");
    cr_assert_null(strstr(cr.err, "default"), "stderr: %s", cr.err);

    const char *both[] = {"LULL_CONF=purge_delay_ms=100", "LULL_PURGE_DELAY_MS=soon", NULL};
    probe("LULL_CONF and a bad LULL_PURGE_DELAY_MS", both, &cr);
    cr_assert_eq(reexec_field(&cr, "delay"), 100);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 1, "stderr: %s", cr.err);
    assert_contains(cr.err, "LULL_PURGE_DELAY_MS: bad value 'soon'");
    assert_contains(cr.err, "keeping purge_delay_ms=100 from LULL_CONF");

    const char *later[] = {"LULL_CONF=purge_delay_ms=100,purge_delay_ms=200", NULL};
    probe("good repeat", later, &cr);
    cr_assert_eq(reexec_field(&cr, "delay"), 200);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 0, "stderr: %s", cr.err);

    const char *first[] = {"LULL_CONF=purge_delay_ms=oops", NULL};
    probe("bad value, nothing before", first, &cr);
    cr_assert_eq((int64_t)reexec_field(&cr, "delay"), -2);
    assert_contains(cr.err, "using the default (auto)");

    /* at run time: the value in force stays, and the message says so */
    char err[1024];
    cr_assert(configure("purge_delay_ms", "300", err, sizeof err));
    cr_assert_not(configure("purge_delay_ms", "oops", err, sizeof err));
    cr_assert_eq(lull_purge_delay_ms(), 300);
    cr_assert_null(strstr(err, "default"), "stderr: %s", err);
    assert_contains(err, "keeping the value in force");
}

/* ------------------------------------------------------------- the cap */

/* 12,000 unknown keys used to print 12,000 lines (553 KB): the first 8
 * problems and a count now; the good keys among them still apply. */
Test(config, start_up_messages_are_capped_at_8_and_a_count, .timeout = 120) {
    enum { UNKNOWN = 12000 };
    static char conf[16 + UNKNOWN * 9 + 64];
    size_t n = (size_t)snprintf(conf, sizeof conf, "LULL_CONF=");
    for (int i = 0; i < UNKNOWN; i++)
        n += (size_t)snprintf(conf + n, sizeof conf - n, "k%05d=1,", i);
    snprintf(conf + n, sizeof conf - n, "purge_delay_ms=777");
    child_run cr;
    const char *vars[] = {conf, "LULL_WARM_RESERVE_MB=lots", NULL};
    probe("12,000 unknown keys", vars, &cr);
    cr_assert_eq(reexec_field(&cr, "delay"), 777);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 9, "stderr: %s", cr.err);
    assert_contains(cr.err, "'k00000'");
    assert_contains(cr.err, "'k00007'");
    cr_assert_null(strstr(cr.err, "'k00008'"), "stderr: %s", cr.err);
    /* 12,000 - 8 unknown keys and the bad LULL_WARM_RESERVE_MB */
    assert_contains(cr.err, "11993 more configuration problems");
}

/* ------------------------------------------------------------ secure mode */

/* A copy of this program, setgid: run by root it is in secure mode
 * (AT_SECURE), as a setuid or setcap program run by another user is. */
static void make_setgid_copy(char *path, size_t len) {
    snprintf(path, len, "%s/test_config_setgid.%d", LULL_BUILD_DIR, (int)getpid());
    int in = open("/proc/self/exe", O_RDONLY | O_CLOEXEC);
    cr_assert(in >= 0);
    unlink(path);
    int out = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0700);
    cr_assert(out >= 0, "%s: %s", path, strerror(errno));
    char buf[1 << 16];
    ssize_t r;
    while ((r = read(in, buf, sizeof buf)) > 0)
        cr_assert_eq(write(out, buf, (size_t)r), r);
    close(in);
    gid_t other = getegid() == 65534 ? 0 : 65534;
    if (fchown(out, (uid_t)-1, other) != 0 || fchmod(out, 02755) != 0) {
        int e = errno;
        close(out);
        unlink(path);
        cr_skip_test("cannot make a setgid copy of the test (%s)", strerror(e));
    }
    close(out);
}

static void run_secure(child_run *cr) {
    char path[512], var[600];
    make_setgid_copy(path, sizeof path);
    snprintf(var, sizeof var, "LULL_TEST_CONFIG_SECURE=%s", path);
    const char *vars[] = {var,
                          "LULL_TEST_CONFIG_PROBE=1",
                          "SECURE_LULL_CONF=purge_delay_ms=1234,warm_reserve_mb=3",
                          "SECURE_LULL_HUGE_CACHE_MB=oops",
                          "SECURE_LULL_PURGE_DELAY_MS=4321",
                          "SECURE_LULL_FAULT=numa",
                          NULL};
    reexec_run("test_config_secure", vars, "secure mode", 60000, cr);
    unlink(path);
    reexec_assert_exited_0(cr, "secure mode");
    if (reexec_field(cr, "at_secure") == 0)
        cr_skip_test("the setgid copy did not run in secure mode (a nosuid file system?)");
}

/* LULL_CONF and LULL_<KEY> come from whoever runs the program: a setuid or
 * setgid program linked with lull must not take them (secure_getenv). */
Test(config, secure_mode_ignores_the_environment, .timeout = 120) {
    child_run cr;
    run_secure(&cr);
    cr_assert_eq((int64_t)reexec_field(&cr, "delay"), LULL_PURGE_DELAY_AUTO,
                 "a secure-mode process took its purge delay from the environment");
    cr_assert_eq(reexec_field(&cr, "warm_mb"), 64);
    cr_assert_eq(lines_starting(cr.err, "lull:"), 0, "stderr: %s", cr.err);
}

/* LULL_FAULT (src/init.c) is read with secure_getenv too: fault injection
 * is never honoured in a secure-mode process. */
Test(config, secure_mode_ignores_lull_fault, .timeout = 120) {
    child_run cr;
    run_secure(&cr);
    cr_assert_eq(reexec_field(&cr, "fault_numa"), 0, "a secure-mode process honoured LULL_FAULT");
}
