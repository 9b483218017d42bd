/* See guest_boot.h. */
#define _GNU_SOURCE
#include "tests/support/guest_boot.h"

#include <criterion/criterion.h>
#include <criterion/logging.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
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
    snprintf(buf, len, "%s/../..", dirname(file));
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

static void out_dir(char *buf, size_t len, const char *src, const char *name) {
#ifdef LULL_BUILD_DIR
    (void)src;
    snprintf(buf, len, "%s/%s", LULL_BUILD_DIR, name);
#else
    snprintf(buf, len, "%s/build/%s", src, name);
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

/* The whole log, then each check's line again (what it got), on stderr. */
static void show_log(const char *path, const char *what) {
    FILE *f = fopen(path, "r");
    if (!f) return;
    char line[8192];
    while (fgets(line, sizeof line, f))
        fputs(line, stderr);
    rewind(f);
    fprintf(stderr, "%s, per check:\n", what);
    while (fgets(line, sizeof line, f))
        if (strncmp(line, "  CHECK ", 8) == 0) fprintf(stderr, "  %s", line + 8);
    fclose(f);
}

void guest_boot_run(const struct guest_boot *b) {
    char src[4096], out[4096], script[4200], log[4200];
    source_dir(src, sizeof src);
    out_dir(out, sizeof out, src, b->out_name);
    snprintf(script, sizeof script, "%s/tests/numa_guest/run.sh", src);
    snprintf(log, sizeof log, "%s.log", out);
    cr_assert_eq(access(script, R_OK), 0, "%s: %s", script, strerror(errno));

    char lib[4096];
    static_lib(lib, sizeof lib);
    if (b->need_lib && !lib[0])
        cr_skip_test("%s skipped: its checks need the allocator, and this build has no liblull.a "
                     "to link (LULL_OVERRIDE off or a sanitizer build)",
                     b->what);

    /* run.sh's own limit stays below this test's and ctest's (600 s). */
    char *argv[64];
    int argc = 0;
    argv[argc++] = "bash";
    argv[argc++] = script;
    argv[argc++] = "--out";
    argv[argc++] = out;
    argv[argc++] = "--timeout";
    argv[argc++] = "420";
    if (lib[0]) {
        argv[argc++] = "--lib";
        argv[argc++] = lib;
    }
    for (int i = 0; b->args[i] && argc < 40; i++)
        argv[argc++] = (char *)b->args[i];
    char extra[2048] = "";
    const char *e = b->args_env ? getenv(b->args_env) : NULL;
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

    show_log(log, b->what);
    char verdict[1024];
    last_line(log, "numa-guest: ", verdict, sizeof verdict);

    cr_assert(WIFEXITED(st), "run.sh died of signal %d", WTERMSIG(st));
    int code = WEXITSTATUS(st);
    if (code == SKIP_STATUS) {
        if (required())
            cr_assert_fail("%s required here (CI or LULL_REQUIRE_NUMA_GUEST=1) but its "
                           "dependencies are missing: %s",
                           b->what, verdict);
        cr_skip_test("%s skipped: %s", b->what, verdict);
    }
    cr_assert_eq(code, 0, "%s failed (run.sh exit %d): %s; log %s", b->what, code, verdict, log);
    cr_log_info("%s (%s): %s", b->what, lib[0] ? lib : "numa/ sources only", verdict);
}
