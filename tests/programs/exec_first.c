/* A program whose first act is an exec through a PATH search, before it
 * allocates anything: /usr/bin/time, env-like launchers and small wrappers
 * do that. Under LD_PRELOAD=liblull.so the exec family is lull's (it
 * removes the counter page's name first), and the C library's PATH
 * searches behind it are only looked up once lull has started, at the
 * first allocation.
 *
 * Usage: prog_exec_first execvp|execvpe|execlp FILE [ARG...]
 *
 * Execs FILE with the arguments (argv[0] = FILE) and the environment as
 * they are. If the exec returns, prints "exec_first: errno N" on stderr
 * (with write(): stdio would allocate) and exits 127. */
#define _GNU_SOURCE
#include <errno.h>
#include <string.h>
#include <unistd.h>

extern char **environ;

static void say_errno(int e) {
    char msg[64] = "exec_first: errno ";
    size_t n = strlen(msg);
    char digits[16];
    int k = 0;
    do {
        digits[k++] = (char)('0' + e % 10);
        e /= 10;
    } while (e && k < (int)sizeof digits);
    while (k)
        msg[n++] = digits[--k];
    msg[n++] = '\n';
    if (write(2, msg, n) < 0) _exit(126);
}

int main(int argc, char **argv) {
    if (argc < 3) {
        static const char usage[] = "usage: prog_exec_first execvp|execvpe|execlp FILE [ARG...]\n";
        if (write(2, usage, sizeof usage - 1) < 0) return 2;
        return 2;
    }
    const char *how = argv[1];
    char **args = argv + 2;
    if (strcmp(how, "execvp") == 0)
        execvp(args[0], args);
    else if (strcmp(how, "execvpe") == 0)
        execvpe(args[0], args, environ);
    else if (strcmp(how, "execlp") == 0)
        execlp(args[0], args[0], (char *)NULL);
    else
        return 2;
    say_errno(errno);
    return 127;
}
