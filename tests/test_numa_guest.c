/* The two-node NUMA system test: boots a qemu guest (TCG) whose /init is
 * tests/numa_guest's static test program, through tests/numa_guest/run.sh,
 * and passes when every guest check passes.
 *
 * Skipped only when qemu-system-x86_64 or the guest kernel image is not
 * installed (.ci/numa-guest-deps.sh installs both). In CI (CI=true), or
 * with LULL_REQUIRE_NUMA_GUEST=1, a missing dependency fails the test
 * instead, so a CI machine without them cannot pass by skipping;
 * LULL_REQUIRE_NUMA_GUEST=0 turns that off. LULL_NUMA_GUEST_ARGS adds
 * arguments to run.sh (for example "--only topology,lull_local").
 *
 * The guest program is linked with this build's liblull.a (run.sh --lib),
 * so the guest also runs the whole-allocator checks of check_lull.c. Not
 * in a build whose malloc is not lull's (LULL_OVERRIDE off, sanitizer
 * builds): there only the numa/ checks run. LULL_NUMA_GUEST_LIB names
 * another liblull.a, or "none" for the numa/ checks alone. */
#define _GNU_SOURCE
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#define SKIP_STATUS 77

static bool required(void) {
    const char *r = getenv("LULL_REQUIRE_NUMA_GUEST");
    if (r && *r) return strcmp(r, "0") != 0;
    const char *ci = getenv("CI");
    return ci && (strcmp(ci, "true") == 0 || strcmp(ci, "1") == 0);
}

static void source_dir(char *buf, size_t len) {
#ifdef LULL_SOURCE_DIR
    snprintf(buf, len, "%s", LULL_SOURCE_DIR);
#else
    char file[4096];
    snprintf(file, sizeof file, "%s", __FILE__);
    snprintf(buf, len, "%s/..", dirname(file));
#endif
}

/* The liblull.a to link the guest program with, or "" for none. */
static void static_lib(char *buf, size_t len) {
    buf[0] = '\0';
    const char *e = getenv("LULL_NUMA_GUEST_LIB");
    if (e && *e) {
        if (strcmp(e, "none") != 0) snprintf(buf, len, "%s", e);
        return;
    }
#if defined(LULL_OVERRIDE) && !defined(LULL_SANITIZED)
#ifdef LULL_SO_PATH
    char so[4096];
    snprintf(so, sizeof so, "%s", LULL_SO_PATH);
    snprintf(buf, len, "%s/liblull.a", dirname(so)); /* beside liblull.so */
    if (access(buf, R_OK) == 0) return;
#endif
#ifdef LULL_BUILD_DIR
    snprintf(buf, len, "%s/liblull.a", LULL_BUILD_DIR);
    if (access(buf, R_OK) == 0) return;
#endif
    buf[0] = '\0';
#endif
}

static void out_dir(char *buf, size_t len, const char *src) {
#ifdef LULL_BUILD_DIR
    (void)src;
    snprintf(buf, len, "%s/numa-guest", LULL_BUILD_DIR);
#else
    snprintf(buf, len, "%s/build/numa-guest", src);
#endif
}

/* The last line of the log that starts with prefix, without it. */
static void last_line(const char *path, const char *prefix, char *out, size_t len) {
    out[0] = '\0';
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    size_t pl = strlen(prefix);
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, prefix, pl) != 0) continue;
        line[strcspn(line, "\n")] = '\0';
        size_t n = strlen(line + pl);
        if (n >= len) n = len - 1;
        memcpy(out, line + pl, n);
        out[n] = '\0';
    }
    fclose(f);
}

Test(numa_guest, two_nodes_in_qemu, .timeout = 590) {
    char src[4096], out[4096], script[4200], log[4200];
    source_dir(src, sizeof src);
    out_dir(out, sizeof out, src);
    snprintf(script, sizeof script, "%s/tests/numa_guest/run.sh", src);
    snprintf(log, sizeof log, "%s.log", out);
    cr_assert_eq(access(script, R_OK), 0, "%s: %s", script, strerror(errno));

    /* run.sh's own limit stays below this test's and ctest's (600 s). */
    char *argv[64];
    int argc = 0;
    argv[argc++] = "bash";
    argv[argc++] = script;
    argv[argc++] = "--out";
    argv[argc++] = out;
    argv[argc++] = "--timeout";
    argv[argc++] = "420";
    char lib[4096];
    static_lib(lib, sizeof lib);
    if (lib[0]) {
        argv[argc++] = "--lib";
        argv[argc++] = lib;
    }
    char extra[2048] = "";
    const char *e = getenv("LULL_NUMA_GUEST_ARGS");
    if (e) snprintf(extra, sizeof extra, "%s", e);
    for (char *save = NULL, *tok = strtok_r(extra, " ", &save); tok && argc < 62;
         tok = strtok_r(NULL, " ", &save))
        argv[argc++] = tok;
    argv[argc] = NULL;

    fflush(stdout);
    fflush(stderr);
    pid_t pid = fork();
    cr_assert_geq(pid, 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        int devnull = open("/dev/null", O_RDONLY);
        if (devnull >= 0) dup2(devnull, 0);
        execvp("bash", argv);
        _exit(127);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }

    /* Show what the guest printed (ctest --output-on-failure shows it). */
    FILE *f = fopen(log, "r");
    if (f) {
        char line[8192];
        while (fgets(line, sizeof line, f))
            fputs(line, stderr);
        fclose(f);
    }
    char verdict[1024];
    last_line(log, "numa-guest: ", verdict, sizeof verdict);

    cr_assert(WIFEXITED(st), "run.sh died of signal %d", WTERMSIG(st));
    int code = WEXITSTATUS(st);
    if (code == SKIP_STATUS) {
        if (required())
            cr_assert_fail("NUMA guest test required here (CI or LULL_REQUIRE_NUMA_GUEST=1) but "
                           "its dependencies are missing: %s",
                           verdict);
        cr_skip_test("NUMA guest test skipped: %s", verdict);
    }
    cr_assert_eq(code, 0, "NUMA guest test failed (run.sh exit %d): %s; log %s", code, verdict,
                 log);
    cr_log_info("NUMA guest (%s): %s", lib[0] ? lib : "numa/ sources only", verdict);
}
