/* lull's C++ operators (src/cxx_operators.c): liblull.so exports all twenty
 * and still needs no C++ runtime, a C program (this one) links liblull.a
 * without one, and the checks of tests/cxx/operators.cc pass in C++
 * programs linked with liblull.so and with liblull.a, each check in a
 * process of its own: lull's operators resolve, every form allocates with
 * its alignment and frees, failure follows the standard (nullptr, bad_alloc,
 * the new_handler and its retry), and a sized delete with the wrong size
 * aborts with lull's message naming the block; and a C++ plugin of a C
 * program gets the same (tests/cxx/plugin.cc).
 *
 * Only in LULL_OVERRIDE builds: elsewhere a sanitizer (or libstdc++) owns
 * the operators. */
#define _GNU_SOURCE
#include "tests/support/command_output.h"

#include <criterion/criterion.h>

#include <errno.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LULL_SO_PATH
#error "LULL_SO_PATH (the path of liblull.so) must be defined"
#endif
#ifndef LULL_BUILD_DIR
#error "LULL_BUILD_DIR must be defined"
#endif

#ifdef LULL_OVERRIDE
#define REQUIRE_OPERATORS() ((void)0)
#else
#define REQUIRE_OPERATORS() cr_skip_test("LULL_OVERRIDE is off: lull exports no C++ operators")
#endif

static const char *const operator_names[] = {
    "_Znwm",
    "_Znam",
    "_ZnwmRKSt9nothrow_t",
    "_ZnamRKSt9nothrow_t",
    "_ZnwmSt11align_val_t",
    "_ZnamSt11align_val_t",
    "_ZnwmSt11align_val_tRKSt9nothrow_t",
    "_ZnamSt11align_val_tRKSt9nothrow_t",
    "_ZdlPv",
    "_ZdaPv",
    "_ZdlPvm",
    "_ZdaPvm",
    "_ZdlPvSt11align_val_t",
    "_ZdaPvSt11align_val_t",
    "_ZdlPvmSt11align_val_t",
    "_ZdaPvmSt11align_val_t",
    "_ZdlPvRKSt9nothrow_t",
    "_ZdaPvRKSt9nothrow_t",
    "_ZdlPvSt11align_val_tRKSt9nothrow_t",
    "_ZdaPvSt11align_val_tRKSt9nothrow_t",
};
#define N_OPERATORS (sizeof operator_names / sizeof operator_names[0])

/* ---- running a program ------------------------------------------------------- */

typedef struct {
    int status; /* wait status */
    char out[1 << 14], err[1 << 14];
} run_result;

static void read_back(int fd, char *buf, size_t cap) {
    ssize_t n = pread(fd, buf, cap - 1, 0);
    buf[n > 0 ? n : 0] = 0;
    close(fd);
}

/* Runs argv (argv[0] a path) with stdout and stderr caught; killed after
 * 60 s, which fails the test. */
static void run(const char *const *argv, run_result *r) {
    int out = memfd_create("out", MFD_CLOEXEC), err = memfd_create("err", MFD_CLOEXEC);
    cr_assert(out >= 0 && err >= 0, "memfd_create: %s", strerror(errno));
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(out, 1);
        dup2(err, 2);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    struct timespec tick = {0, 5 * 1000 * 1000};
    for (int waited = 0;; waited++) {
        pid_t w = waitpid(pid, &r->status, WNOHANG);
        cr_assert_geq(w, 0, "waitpid: %s", strerror(errno));
        if (w == pid) break;
        if (waited == 60 * 200) {
            kill(pid, SIGKILL);
            waitpid(pid, &r->status, 0);
            cr_assert_fail("%s %s: no exit after 60 s", argv[0], argv[1] ? argv[1] : "");
        }
        nanosleep(&tick, NULL);
    }
    read_back(out, r->out, sizeof r->out);
    read_back(err, r->err, sizeof r->err);
}

/* A command's stdout (popen): for nm and readelf. */
static char *tool_output(const char *cmd) {
    int status;
    char *out = command_output(cmd, &status);
    cr_assert_eq(status, 0, "%s failed", cmd);
    return out;
}

/* ---- the libraries ------------------------------------------------------------- */

/* `nm -D`: each operator is a defined text symbol of liblull.so. */
Test(cxx_operators, liblull_so_exports_every_operator) {
    REQUIRE_OPERATORS();
    char *syms = tool_output("nm -D --defined-only '" LULL_SO_PATH "'");
    for (size_t i = 0; i < N_OPERATORS; i++) {
        char line[128];
        snprintf(line, sizeof line, " T %s\n", operator_names[i]);
        cr_expect_not_null(strstr(syms, line), "liblull.so does not export %s", operator_names[i]);
    }
    free(syms);
}

static void assert_no_cxx_runtime(const char *file) {
#ifdef LULL_SANITIZED
    cr_skip_test("a sanitizer build: its runtime is what %s needs", file);
#endif
    char cmd[512];
    snprintf(cmd, sizeof cmd, "readelf -d '%s'", file);
    char *dyn = tool_output(cmd);
    cr_assert_not_null(strstr(dyn, "(NEEDED)"), "readelf -d %s shows no NEEDED entry", file);
    cr_expect_null(strstr(dyn, "libstdc++"), "%s needs libstdc++:\n%s", file, dyn);
    cr_expect_null(strstr(dyn, "libgcc_s"), "%s needs libgcc_s:\n%s", file, dyn);
    free(dyn);
}

/* The operators are C: a preloaded liblull.so loads into a C program with
 * libc alone. */
Test(cxx_operators, liblull_so_needs_no_cxx_runtime) {
    assert_no_cxx_runtime(LULL_SO_PATH);
}

/* This test program is C, linked with liblull.a by the C compiler: the
 * archive's operator object (the one that names libstdc++) stays out. */
Test(cxx_operators, a_c_program_links_liblull_a_without_the_cxx_runtime) {
    assert_no_cxx_runtime("/proc/self/exe");
}

/* ---- the checks of tests/cxx/operators.cc ------------------------------------------ */

static const char *const kinds[] = {"shared", "static"};

static void program(const char *kind, char *out, size_t n) {
    snprintf(out, n, "%s/tests/cxx_operators_%s", LULL_BUILD_DIR, kind);
    cr_assert_eq(access(out, X_OK), 0, "%s was not built", out);
}

/* Runs `check` in the program of each kind: it must exit 0 saying ok. */
static void passes(const char *check) {
    REQUIRE_OPERATORS();
    for (size_t k = 0; k < 2; k++) {
        char prog[4096], ok[64];
        program(kinds[k], prog, sizeof prog);
        const char *argv[] = {prog, check, kinds[k], NULL};
        run_result *r = malloc(sizeof *r);
        run(argv, r);
        snprintf(ok, sizeof ok, "ok %s\n", check);
        cr_expect(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0 && !strcmp(r->out, ok),
                  "%s (%s): status %#x, stdout '%s', stderr '%s'", check, kinds[k], r->status,
                  r->out, r->err);
        free(r);
    }
}

Test(cxx_operators, the_operators_resolve_to_lull) {
    passes("resolve");
}

Test(cxx_operators, every_form_allocates_aligned_and_frees) {
    passes("align");
}

Test(cxx_operators, nothrow_forms_return_nullptr_on_a_huge_request) {
    passes("nothrow_huge");
}

Test(cxx_operators, throwing_forms_throw_bad_alloc_on_a_huge_request) {
    passes("throw_huge");
}

Test(cxx_operators, a_new_handler_that_uninstalls_itself_is_called_once) {
    passes("handler_uninstalls");
}

/* The nothrow forms return nullptr for it: libstdc++'s catch, which lull's
 * C operators borrow. */
Test(cxx_operators, a_new_handler_that_throws_bad_alloc) {
    passes("handler_throws");
}

Test(cxx_operators, a_new_handler_that_frees_memory_lets_the_retry_succeed) {
    passes("handler_frees");
}

/* Runs `check`: it must abort with lull's message for the block it names
 * on stderr ("block 0x..."), naming `who` and the problem. */
static void aborts(const char *check, const char *who) {
    REQUIRE_OPERATORS();
    for (size_t k = 0; k < 2; k++) {
        char prog[4096];
        program(kinds[k], prog, sizeof prog);
        const char *argv[] = {prog, check, NULL};
        run_result *r = malloc(sizeof *r);
        run(argv, r);
        cr_assert(WIFSIGNALED(r->status) && WTERMSIG(r->status) == SIGABRT,
                  "%s (%s): status %#x, stdout '%s', stderr '%s'", check, kinds[k], r->status,
                  r->out, r->err);
        void *block = NULL;
        const char *at = strstr(r->err, "block 0x");
        cr_assert(at && sscanf(at, "block %p", &block) == 1, "%s: no address on stderr: '%s'",
                  check, r->err);
        char expected[256];
        snprintf(expected, sizeof expected, "lull: %s: size ", who);
        const char *msg = strstr(r->err, expected);
        cr_assert_not_null(msg, "%s (%s): no '%s' on stderr: '%s'", check, kinds[k], expected,
                           r->err);
        snprintf(expected, sizeof expected, "does not match block %p ", block);
        cr_assert_not_null(strstr(msg, expected), "%s (%s): stderr '%s' lacks '%s'", check,
                           kinds[k], r->err, expected);
        free(r);
    }
}

/* delete of a derived object through a base without a virtual destructor:
 * the compiler's sized delete says sizeof(base). */
Test(cxx_operators, delete_of_a_wrongly_sized_object_aborts) {
    aborts("wrong_size", "operator delete");
}

Test(cxx_operators, sized_delete_array_with_the_wrong_size_aborts) {
    aborts("wrong_size_array", "operator delete[]");
}

Test(cxx_operators, sized_aligned_delete_with_the_wrong_size_aborts) {
    aborts("wrong_size_aligned", "operator delete");
}

/* A C program linked with liblull.so loads a C++ plugin (RTLD_LOCAL):
 * libstdc++ comes after lull's weak references to it were bound, into a
 * local scope, and the plugin's new still throws, calls its handler and
 * returns nullptr as the standard says (tests/cxx/plugin.cc). */
Test(cxx_operators, a_cxx_plugin_of_a_c_program) {
    REQUIRE_OPERATORS();
    char host[4096], plugin[4096];
    snprintf(host, sizeof host, "%s/tests/cxx_plugin_host", LULL_BUILD_DIR);
    snprintf(plugin, sizeof plugin, "%s/tests/cxx_plugin.so", LULL_BUILD_DIR);
    cr_assert_eq(access(host, X_OK), 0, "%s was not built", host);
    const char *argv[] = {host, plugin, NULL};
    run_result *r = malloc(sizeof *r);
    run(argv, r);
    cr_expect(WIFEXITED(r->status) && WEXITSTATUS(r->status) == 0 && !strcmp(r->out, "ok plugin\n"),
              "status %#x, stdout '%s', stderr '%s'", r->status, r->out, r->err);
    free(r);
}
