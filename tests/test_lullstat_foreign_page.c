/* lullstat PID and a file another user put at the process's page name.
 *
 * The default page name, /dev/shm/lull.<pid>, is predictable, and anyone
 * may create it first: lull then leaves the file alone and runs without a
 * page (tests/test_counter_page.c). lullstat took that file for the
 * process's page all the same, whatever user owned it: it printed the
 * other user's figures as the process's, and lullstat --heap-profile,
 * answered through that page, moved that user's ".heap" file to FILE as
 * the process's profile. A page of another user than the process's is
 * refused now, with a message saying so (exit 4: the process has none).
 *
 * Needs root (to make a file of uid 65534 at the name); the files live on a
 * private tmpfs over /dev/shm when the test may mount one. */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include "lull/counters.h"
#include "base/config.h"
#include "src/counter_page.h"

#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef LULL_BUILD_DIR
#define LULL_BUILD_DIR "."
#endif

extern char **environ;

static const char *lullstat_path(void) {
    const char *p = getenv("LULLSTAT");
    return p && *p ? p : LULL_BUILD_DIR "/tools/lullstat";
}

/* See tests/test_lullstat.c: a private /dev/shm when the test may. */
static void isolate_dev_shm(void) {
    if (unshare(CLONE_NEWNS) == 0 && mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0)
        mount("lulltest", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "size=4m,mode=1777");
}

static void setup(void) {
    if (geteuid() != 0) cr_skip_test("needs root, to make a file of another user");
    /* no page of this test's own (the reclaim thread reads it) */
    __atomic_store_n(&lull_config.counter_page, false, __ATOMIC_RELAXED);
    counter_page_close();
    isolate_dev_shm();
    cr_assert_eq(access(lullstat_path(), X_OK), 0, "lullstat not found at %s", lullstat_path());
}

/* lullstat with args; its exit code, stdout and stderr. */
static int run_lullstat(const char *const *args, char *out, size_t outlen, char *err,
                        size_t errlen) {
    int o = memfd_create("out", MFD_CLOEXEC), e = memfd_create("err", MFD_CLOEXEC);
    cr_assert(o >= 0 && e >= 0);
    const char *argv[16] = {"lullstat"};
    int n = 1;
    for (; args[n - 1] && n < 15; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        dup2(o, 1);
        dup2(e, 2);
        execve(lullstat_path(), (char *const *)argv, environ);
        _exit(121);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    ssize_t k = pread(o, out, outlen - 1, 0);
    out[k > 0 ? k : 0] = '\0';
    k = pread(e, err, errlen - 1, 0);
    err[k > 0 ? k : 0] = '\0';
    close(o);
    close(e);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* A live process of this test's user (root), without a page. */
static pid_t start_sleeper(void) {
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        for (;;)
            pause();
    }
    return pid;
}

/* /dev/shm/<name> of uid 65534, readable and writable by all: a counter
 * page in every respect but its owner, naming pid, that serves requests
 * and has answered them all already. */
static void plant_page(const char *name, pid_t pid) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    int fd = open(path, O_CREAT | O_EXCL | O_RDWR, 0666);
    cr_assert(fd >= 0, "%s: %s", path, strerror(errno));
    static char file[LULL_COUNTERS_FILE_SIZE];
    struct lull_counters *c = (struct lull_counters *)file;
    c->magic = LULL_COUNTERS_MAGIC;
    c->abi_version = LULL_COUNTERS_ABI_VERSION;
    c->size = sizeof *c;
    c->pid = (uint64_t)pid;
    c->seq = 2;
    c->flags = LULL_COUNTERS_F_RECLAIM_THREAD | LULL_COUNTERS_F_PROFILE_REQUESTS;
    c->malloc_count = 31337;
    lull_counters_request_block(file)->profile_done = UINT64_C(1) << 62;
    cr_assert_eq(pwrite(fd, file, sizeof file, 0), (ssize_t)sizeof file);
    cr_assert_eq(fchown(fd, 65534, 65534), 0, "%s", strerror(errno));
    cr_assert_eq(fchmod(fd, 0666), 0);
    close(fd);
}

Test(lullstat_foreign_page, another_users_file_at_the_name_is_not_the_process_page, .init = setup,
     .timeout = 60) {
    pid_t sleeper = start_sleeper();
    char name[64], pid[24], path[128], heap[160], out[8192], err[4096];
    snprintf(name, sizeof name, "lull.%d", (int)sleeper);
    snprintf(pid, sizeof pid, "%d", (int)sleeper);
    snprintf(path, sizeof path, "/dev/shm/%s", name);
    snprintf(heap, sizeof heap, "%s.heap", path);
    plant_page(name, sleeper);
    /* and the "profile" that page would answer with */
    int h = open(heap, O_CREAT | O_EXCL | O_WRONLY, 0666);
    cr_assert(h >= 0);
    cr_assert_eq(write(h, "not a profile\n", 14), 14);
    cr_assert_eq(fchown(h, 65534, 65534), 0);
    close(h);

    int rc = run_lullstat((const char *const[]){pid, NULL}, out, sizeof out, err, sizeof err);
    cr_expect_eq(rc, 4, "lullstat %s: exit %d\nstdout:\n%s\nstderr:\n%s", pid, rc, out, err);
    cr_expect_null(strstr(out, "31337"), "another user's figures shown as the process's:\n%s", out);
    cr_expect(strstr(err, "belongs to uid 65534"), "stderr: %s", err);

    char dest[128];
    snprintf(dest, sizeof dest, "%s/test_lullstat_foreign.%d.pb.gz", LULL_BUILD_DIR, (int)getpid());
    unlink(dest);
    rc = run_lullstat((const char *const[]){"--heap-profile", "-t", "2", pid, dest, NULL}, out,
                      sizeof out, err, sizeof err);
    bool taken = access(dest, F_OK) == 0;
    unlink(dest);
    unlink(heap);
    unlink(path);
    kill(sleeper, SIGKILL);
    waitpid(sleeper, NULL, 0);
    cr_expect_eq(rc, 4, "lullstat --heap-profile %s: exit %d\nstdout:\n%s\nstderr:\n%s", pid, rc,
                 out, err);
    cr_expect_not(taken, "another user's file was taken as the process's heap profile");
}
