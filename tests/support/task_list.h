/* The threads of this process, from /proc/self/task: header-only (static
 * inline), no Criterion, so re-executed children can use it too. */
#ifndef LULL_TEST_TASK_LIST_H
#define LULL_TEST_TASK_LIST_H

#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The name (comm) of thread `tid` of this process; "" if it is gone. */
static inline void read_task_comm(const char *tid, char *comm, size_t len) {
    char path[300];
    snprintf(path, sizeof path, "/proc/self/task/%s/comm", tid);
    comm[0] = 0;
    FILE *f = fopen(path, "r");
    if (!f) return;
    if (!fgets(comm, (int)len, f)) comm[0] = 0;
    fclose(f);
    comm[strcspn(comm, "\n")] = 0;
}

/* The tid of a thread of this process named `comm`, or 0. */
static inline int task_named(const char *comm) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 0;
    int tid = 0;
    for (struct dirent *e; !tid && (e = readdir(d));) {
        char name[64];
        if (e->d_name[0] == '.') continue;
        read_task_comm(e->d_name, name, sizeof name);
        if (strcmp(name, comm) == 0) tid = atoi(e->d_name);
    }
    closedir(d);
    return tid;
}

/* How many threads this process has. */
static inline int task_count(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return -1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d));)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

/* The CPU set of thread `tid` (0: the caller), its first 64 CPUs as bits;
 * 0 if it cannot be read. */
static inline unsigned long long task_cpu_mask(int tid) {
    cpu_set_t s;
    unsigned long long mask = 0;
    if (sched_getaffinity(tid, sizeof s, &s) == 0)
        for (int c = 0; c < 64; c++)
            if (CPU_ISSET(c, &s)) mask |= 1ull << c;
    return mask;
}

#endif
