/* The PATH search of execvp() (base/exec_search.h). */
#define _GNU_SOURCE /* strchrnul */
#include "base/exec_search.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <limits.h>
#include <paths.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* The kernel would not exec `file` (no #!, no ELF): the shell runs it, with
 * the arguments after argv[0]. */
LULL_FORK_EXEC_TEXT static void exec_as_script(const char *file, char *const argv[],
                                               char *const envp[], lull_execve_fn execve_fn) {
    size_t argc = 0;
    while (argv[argc])
        argc++;
    size_t extra = argc > 1 ? argc - 1 : 0; /* the arguments after argv[0] */
    char *shell_argv[2 + extra + 1];
    shell_argv[0] = (char *)_PATH_BSHELL;
    shell_argv[1] = (char *)file;
    for (size_t i = 0; i < extra; i++)
        shell_argv[2 + i] = argv[1 + i];
    shell_argv[2 + extra] = NULL;
    execve_fn(shell_argv[0], shell_argv, envp);
}

LULL_FORK_EXEC_TEXT static void exec_one(const char *path, char *const argv[], char *const envp[],
                                         lull_execve_fn execve_fn) {
    execve_fn(path, argv, envp);
    if (errno == ENOEXEC) exec_as_script(path, argv, envp, execve_fn); /* errno: the shell's */
}

LULL_FORK_EXEC_TEXT int lull_exec_search(const char *file, char *const argv[], char *const envp[],
                                         lull_execve_fn execve_fn) {
    if (*file == '\0') {
        errno = ENOENT;
        return -1;
    }
    if (strchr(file, '/')) {
        exec_one(file, argv, envp, execve_fn);
        return -1;
    }
    const char *path = getenv("PATH");
    if (!path) path = "/bin:/usr/bin"; /* glibc's _CS_PATH */
    size_t file_len = strnlen(file, NAME_MAX + 1);
    if (file_len > NAME_MAX) {
        errno = ENAMETOOLONG;
        return -1;
    }
    bool denied = false;
    for (const char *entry = path;;) {
        const char *end = strchrnul(entry, ':');
        size_t dir_len = (size_t)(end - entry);
        if (dir_len < PATH_MAX - file_len - 1) { /* longer entries are passed over */
            char candidate[PATH_MAX];
            memcpy(candidate, entry, dir_len);
            size_t at = dir_len;
            if (dir_len) candidate[at++] = '/'; /* an empty entry: the working directory */
            memcpy(candidate + at, file, file_len + 1);
            exec_one(candidate, argv, envp, execve_fn);
            switch (errno) {
            case EACCES:
                denied = true;
                break;
            case ENOENT:
            case ESTALE:
            case ENOTDIR:
            case ENODEV:
            case ETIMEDOUT:
                break;
            default:
                return -1;
            }
        }
        if (*end == '\0') break;
        entry = end + 1;
    }
    if (denied) errno = EACCES;
    return -1;
}
