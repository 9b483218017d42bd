/* See hang_report.h. */
#define _GNU_SOURCE
#include "tests/support/hang_report.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* /proc/PID/task/TID/<name>, every line prefixed, or nothing if unreadable
 * (a kernel stack needs root). */
static void copy_task_file(pid_t pid, const char *tid, const char *name, FILE *out) {
    char path[320], line[512];
    snprintf(path, sizeof path, "/proc/%d/task/%s/%s", (int)pid, tid, name);
    FILE *f = fopen(path, "r");
    if (!f) return;
    while (fgets(line, sizeof line, f))
        fprintf(out, "    %s: %s", name, line);
    fclose(f);
}

void hang_report(pid_t pid, FILE *out) {
    char dir[64];
    snprintf(dir, sizeof dir, "/proc/%d/task", (int)pid);
    DIR *d = opendir(dir);
    fprintf(out, "hung process %d:\n", (int)pid);
    if (d) {
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.') continue;
            fprintf(out, "  thread %s\n", e->d_name);
            copy_task_file(pid, e->d_name, "comm", out);
            copy_task_file(pid, e->d_name, "wchan", out);
            copy_task_file(pid, e->d_name, "syscall", out);
            copy_task_file(pid, e->d_name, "stack", out);
        }
        closedir(d);
    }
    if (access("/usr/bin/gdb", X_OK) != 0) return;
    char cmd[160];
    snprintf(cmd, sizeof cmd,
             "/usr/bin/gdb -p %d -batch -nx -ex 'thread apply all bt' 2>/dev/null </dev/null",
             (int)pid);
    fflush(out);
    FILE *g = popen(cmd, "r");
    if (!g) return;
    char line[512];
    while (fgets(line, sizeof line, g))
        fprintf(out, "  gdb: %s", line);
    pclose(g);
}
