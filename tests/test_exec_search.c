/* base/exec_search.c, the PATH search lull's execvp and execvpe do before
 * lull has looked up the C library's (a process that execs before its
 * first allocation; tests/test_preload_programs.c runs real programs so).
 * Here the search runs against a fake execve that records every attempt
 * and fails each with the errno its table gives: the order of the
 * attempts, the shell's arguments for a script, and the errno returned
 * follow glibc's posix/execvpe.c. */
#define _GNU_SOURCE
#include "base/exec_search.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_ATTEMPTS 16
#define MAX_ARGS 8

static struct {
    char path[PATH_MAX];
    char argv[MAX_ARGS][64];
    int argc;
} attempts[MAX_ATTEMPTS];
static int n_attempts;

/* path -> errno of its exec; any other path fails with ENOENT */
static const struct outcome {
    const char *path;
    int err;
} * outcomes;

static int fake_execve(const char *path, char *const argv[], char *const envp[]) {
    (void)envp;
    cr_assert_lt(n_attempts, MAX_ATTEMPTS, "too many exec attempts");
    snprintf(attempts[n_attempts].path, PATH_MAX, "%s", path);
    int argc = 0;
    for (; argv[argc]; argc++) {
        cr_assert_lt(argc, MAX_ARGS);
        snprintf(attempts[n_attempts].argv[argc], 64, "%s", argv[argc]);
    }
    attempts[n_attempts++].argc = argc;
    errno = ENOENT;
    for (const struct outcome *o = outcomes; o && o->path; o++)
        if (!strcmp(o->path, path)) errno = o->err;
    return -1;
}

/* Searches for `file` with PATH set to `path` (NULL: unset); returns the
 * errno the search left. */
static int search(const char *file, const char *path, const struct outcome *table) {
    if (path)
        cr_assert_eq(setenv("PATH", path, 1), 0);
    else
        cr_assert_eq(unsetenv("PATH"), 0);
    outcomes = table;
    n_attempts = 0;
    char *argv[] = {(char *)file, "one", "two", NULL};
    char *envp[] = {NULL};
    errno = 0;
    cr_assert_eq(lull_exec_search(file, argv, envp, fake_execve), -1);
    return errno;
}

static void expect_attempts(const char *const *paths) {
    int n = 0;
    for (; paths[n]; n++) {
        cr_assert_lt(n, n_attempts, "attempt %d (%s) was not made", n, paths[n]);
        cr_expect_str_eq(attempts[n].path, paths[n], "attempt %d", n);
    }
    cr_assert_eq(n_attempts, n, "%d attempts, %d expected", n_attempts, n);
}

Test(exec_search, tries_every_entry_in_order) {
    cr_assert_eq(search("prog", "/a:/b/c:/d", NULL), ENOENT);
    expect_attempts((const char *[]){"/a/prog", "/b/c/prog", "/d/prog", NULL});
    cr_expect_str_eq(attempts[0].argv[0], "prog", "argv is passed as it is");
    cr_expect_eq(attempts[0].argc, 3);
}

Test(exec_search, an_empty_entry_is_the_working_directory) {
    cr_assert_eq(search("prog", ":/a::", NULL), ENOENT);
    expect_attempts((const char *[]){"prog", "/a/prog", "prog", "prog", NULL});
}

Test(exec_search, no_path_searches_bin_then_usr_bin) {
    cr_assert_eq(search("prog", NULL, NULL), ENOENT);
    expect_attempts((const char *[]){"/bin/prog", "/usr/bin/prog", NULL});
}

Test(exec_search, eacces_is_remembered_while_the_search_goes_on) {
    static const struct outcome t[] = {{"/a/prog", EACCES}, {NULL, 0}};
    cr_assert_eq(search("prog", "/a:/b", t), EACCES);
    expect_attempts((const char *[]){"/a/prog", "/b/prog", NULL});
}

Test(exec_search, entries_that_do_not_hold_it_are_passed_over) {
    static const struct outcome t[] = {{"/a/prog", ENOTDIR},
                                       {"/b/prog", ESTALE},
                                       {"/c/prog", ENODEV},
                                       {"/d/prog", ETIMEDOUT},
                                       {NULL, 0}};
    cr_assert_eq(search("prog", "/a:/b:/c:/d:/e", t), ENOENT);
    expect_attempts((const char *[]){"/a/prog", "/b/prog", "/c/prog", "/d/prog", "/e/prog", NULL});
}

Test(exec_search, another_error_ends_the_search) {
    static const struct outcome t[] = {{"/b/prog", E2BIG}, {NULL, 0}};
    cr_assert_eq(search("prog", "/a:/b:/c", t), E2BIG);
    expect_attempts((const char *[]){"/a/prog", "/b/prog", NULL});
}

/* ENOEXEC: /bin/sh runs the file with the arguments after argv[0]; when
 * that fails too, its errno decides whether the search goes on. */
Test(exec_search, a_file_the_kernel_will_not_exec_goes_to_the_shell) {
    static const struct outcome t[] = {{"/a/prog", ENOEXEC}, {NULL, 0}};
    cr_assert_eq(search("prog", "/a:/b", t), ENOENT);
    expect_attempts((const char *[]){"/a/prog", "/bin/sh", "/b/prog", NULL});
    cr_assert_eq(attempts[1].argc, 4);
    cr_expect_str_eq(attempts[1].argv[0], "/bin/sh");
    cr_expect_str_eq(attempts[1].argv[1], "/a/prog");
    cr_expect_str_eq(attempts[1].argv[2], "one");
    cr_expect_str_eq(attempts[1].argv[3], "two");
}

Test(exec_search, a_name_with_a_slash_is_not_searched) {
    static const struct outcome t[] = {{"./prog", ENOEXEC}, {"/bin/sh", EACCES}, {NULL, 0}};
    cr_assert_eq(search("./prog", "/a:/b", t), EACCES);
    expect_attempts((const char *[]){"./prog", "/bin/sh", NULL});
}

Test(exec_search, an_empty_name_is_enoent_without_an_attempt) {
    cr_assert_eq(search("", "/a", NULL), ENOENT);
    cr_assert_eq(n_attempts, 0);
}

Test(exec_search, a_name_longer_than_name_max_is_enametoolong) {
    char name[NAME_MAX + 2];
    memset(name, 'x', sizeof name - 1);
    name[sizeof name - 1] = 0;
    cr_assert_eq(search(name, "/a", NULL), ENAMETOOLONG);
    cr_assert_eq(n_attempts, 0);
}

Test(exec_search, an_entry_too_long_for_a_path_is_passed_over) {
    static char path[PATH_MAX + 16];
    memset(path, 'd', PATH_MAX);
    path[0] = '/';
    snprintf(path + PATH_MAX, sizeof path - PATH_MAX, ":/a");
    cr_assert_eq(search("prog", path, NULL), ENOENT);
    expect_attempts((const char *[]){"/a/prog", NULL});
}
