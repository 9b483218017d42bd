/* A fork child's page faults under lull: prints the fewest minor faults
 * any of 40 children took between fork() and _exit(0) (wait4's rusage),
 * twice in one process: before lull's reclaim thread exists (only
 * mallocs so far: nothing to purge), and once it has opened its purge
 * ring and its refault monitor, which every child's handlers then forget.
 * A thread of the program's own idles throughout, so that glibc's fork
 * takes its multi-threaded path both times. The same process both
 * times: the same layout, so the two counts differ by what forgetting
 * the ring and the monitor costs a child, and by the reclaim thread's
 * descriptor, which glibc writes in the child. Run with
 * LD_PRELOAD=liblull.so; tests/test_preload_programs.c,
 * `a_fork_child_takes_few_page_faults_of_lull`, compares the two. */
#define _GNU_SOURCE
#include "tests/support/timing.h"

#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#define CHILDREN 40
#define BLOCKS 8000

static void *idle(void *arg) {
    (void)arg;
    for (;;)
        pause();
    return NULL;
}

/* Is there a descriptor whose link contains `what`? */
static bool fd_open(const char *what) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while (!found && (e = readdir(d))) {
        char path[300], link[256];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, link, sizeof link - 1);
        if (n <= 0) continue;
        link[n] = '\0';
        found = strstr(link, what) != NULL;
    }
    closedir(d);
    return found;
}

/* The fewest faults of CHILDREN children, -1 on an error. */
static long fewest_child_faults(void) {
    long fewest = -1;
    for (int i = 0; i < CHILDREN; i++) {
        pid_t pid = fork();
        if (pid < 0) return -1;
        if (pid == 0) _exit(0);
        int status;
        struct rusage ru;
        if (wait4(pid, &status, 0, &ru) != pid || !WIFEXITED(status) || WEXITSTATUS(status))
            return -1;
        if (fewest < 0 || ru.ru_minflt < fewest) fewest = ru.ru_minflt;
    }
    return fewest;
}

int main(void) {
    if (!dlsym(RTLD_DEFAULT, "lull_version")) {
        printf("NO-LULL\n");
        return 1;
    }
    static void *blocks[BLOCKS];
    unsigned r = 1;
    for (int i = 0; i < BLOCKS; i++) {
        r = r * 1103515245u + 12345u;
        size_t size = 16 + (r >> 8) % 1009;
        blocks[i] = malloc(size);
        if (!blocks[i]) return 2;
        memset(blocks[i], 1, size);
    }
    pthread_t t;
    if (pthread_create(&t, NULL, idle, NULL) != 0) return 4;
    long before = fewest_child_faults();
    /* lull's thread starts with the spans these frees empty: wait for
     * its ring and then its refault monitor (a scan of pagemap) */
    for (int i = 0; i < BLOCKS; i++)
        free(blocks[i]);
    uint64_t deadline = now_ms() + 60000;
    while (!(fd_open("io_uring") && fd_open("pagemap"))) {
        if (now_ms() >= deadline) {
            printf("NOT-READY\n");
            return 3;
        }
        sleep_ms(10);
    }
    long after = fewest_child_faults();
    if (before < 0 || after < 0) return 5;
    printf("before %ld after %ld\n", before, after);
    return 0;
}
