/* Real programs under LD_PRELOAD=liblull.so: python3, the sqlite3 shell, git,
 * and the two programs in tests/programs/. Each one's output is compared
 * with a run without the preload, and each preloaded run proves that the
 * preload took effect: every process of the run is traced (ptrace, forks and
 * clones followed) and stopped at its exit, where its /proc/<pid>/maps must
 * map the library. One more test checks through the dynamic linker's own
 * report (LD_DEBUG=bindings) that malloc and friends bind to the library,
 * and one checks lull's verbose banner (skipped when LULL_SO_PATH is not
 * lull, e.g. while the tests are validated with jemalloc standing in).
 *
 * A test is skipped only when the program it needs (python3, sqlite3, git)
 * is not installed. Outputs go to a temporary directory, removed at the end
 * unless LULL_TEST_KEEP is set in the environment. */
#define _GNU_SOURCE
#include "tests/support/libc_names.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <pthread.h>
#include <regex.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef LULL_SO_PATH
#error "LULL_SO_PATH (the path of liblull.so) must be defined"
#endif
#ifndef LULL_BUILD_DIR
#error "LULL_BUILD_DIR must be defined"
#endif
#ifndef LULL_SOURCE_DIR
#error "LULL_SOURCE_DIR must be defined"
#endif

extern char **environ;

/* ---- the library and the temporary directory ---------------------------- */

static char g_lib_real[PATH_MAX]; /* realpath of LULL_SO_PATH */
static char g_dir[256];           /* this test's temporary directory */

static void setup(void) {
    cr_assert(realpath(LULL_SO_PATH, g_lib_real) != NULL,
              "the preload library %s does not exist: %s", LULL_SO_PATH, strerror(errno));
}

/* The temporary directory, made on first use (a skipped test makes none:
 * Criterion does not run .fini after a skip). */
static const char *tmp_dir(void) {
    if (!g_dir[0]) {
        snprintf(g_dir, sizeof g_dir, "/tmp/lull-preload-XXXXXX");
        cr_assert(mkdtemp(g_dir) != NULL, "mkdtemp: %s", strerror(errno));
    }
    return g_dir;
}

static int rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st;
    (void)flag;
    (void)ftw;
    remove(path);
    return 0;
}

/* Set by a test that reached its end: the outputs of one that did not are
 * kept for a look. */
static bool g_passed;

static void teardown(void) {
    if (!g_dir[0]) return;
    if (rmdir(g_dir) == 0) return; /* nothing was written (skipped) */
    if (!g_passed || getenv("LULL_TEST_KEEP"))
        fprintf(stderr, "preload test outputs kept in %s\n", g_dir);
    else
        nftw(g_dir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
}

TestSuite(preload, .init = setup, .fini = teardown);

/* liblull.so replaces malloc only when built with LULL_OVERRIDE, and a
 * sanitizer build's library cannot be preloaded into uninstrumented
 * programs (the sanitizer runtime must come first): nothing to test then. */
#if defined(LULL_OVERRIDE) && !defined(LULL_SANITIZED)
#define REQUIRE_PRELOADABLE_BUILD() ((void)0)
#else
#define REQUIRE_PRELOADABLE_BUILD()                                                                \
    cr_skip_test("this build's liblull.so does not replace malloc (LULL_OVERRIDE off or a "        \
                 "sanitizer build)")
#endif

static const char *path_in(const char *name) {
    static __thread char buf[8][PATH_MAX];
    static __thread int k;
    char *b = buf[k++ % 8];
    snprintf(b, PATH_MAX, "%s/%s", tmp_dir(), name);
    return b;
}

/* The full path of an installed program, or false. */
static bool find_program(const char *name, char *out, size_t outlen) {
    const char *path = getenv("PATH");
    if (!path) path = "/usr/local/bin:/usr/bin:/bin";
    while (*path) {
        size_t n = strcspn(path, ":");
        snprintf(out, outlen, "%.*s/%s", (int)n, path, name);
        if (n > 0 && access(out, X_OK) == 0) return true;
        path += n + (path[n] == ':');
    }
    return false;
}

static char *read_file(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    size_t cap = 1 << 16, len = 0;
    char *buf = malloc(cap);
    for (;;) {
        if (len + 1 >= cap) buf = realloc(buf, cap *= 2);
        ssize_t r = read(fd, buf + len, cap - len - 1);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break;
        len += (size_t)r;
    }
    close(fd);
    buf[len] = 0;
    return buf;
}

static void write_file(const char *path, const char *data, size_t len) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert(fd >= 0, "open %s: %s", path, strerror(errno));
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        cr_assert(w > 0, "write %s: %s", path, strerror(errno));
        off += (size_t)w;
    }
    close(fd);
}

/* The last n characters of s, for failure messages. */
static const char *tail(const char *s, size_t n) {
    if (!s) return "(none)";
    size_t len = strlen(s);
    return len > n ? s + len - n : s;
}

/* ---- running a program -------------------------------------------------- */

struct run {
    /* in */
    const char *const *argv; /* argv[0]: absolute path of the program */
    const char *const *env;  /* "NAME=value" entries added (replacing), or NULL */
    bool preload;            /* LD_PRELOAD=LULL_SO_PATH, and trace every process */
    const char *cwd;         /* NULL: the temporary directory */
    const char *stdin_path;  /* NULL: /dev/null */
    int timeout_s;
    const char *tag; /* outputs in <dir>/<tag>.out and <tag>.err */
    /* out */
    int status; /* wait status of the program */
    bool timed_out;
    int procs;          /* processes seen at their exit (preloaded runs) */
    int procs_with_lib; /* ... whose maps held the library */
    bool top_with_lib;  /* the program's own process held it at its exit */
    char without_lib[512];
    char *out, *err; /* stdout and stderr, read back */
};

/* Build the child's environment: ours without LD_PRELOAD, plus extra. */
static char **make_env(const struct run *r, char *preload_entry) {
    size_t n = 0, extra = 0;
    while (environ[n])
        n++;
    if (r->env)
        while (r->env[extra])
            extra++;
    char **env = calloc(n + extra + 2, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const char *e = environ[i];
        if (!strncmp(e, "LD_PRELOAD=", 11)) continue;
        bool replaced = false;
        for (size_t j = 0; j < extra && !replaced; j++) {
            size_t name = strcspn(r->env[j], "=");
            replaced = !strncmp(e, r->env[j], name) && e[name] == '=';
        }
        if (!replaced) env[k++] = (char *)e;
    }
    for (size_t j = 0; j < extra; j++)
        env[k++] = (char *)r->env[j];
    if (r->preload) env[k++] = preload_entry;
    env[k] = NULL;
    return env;
}

struct watchdog {
    pthread_mutex_t lock;
    pthread_cond_t cond;
    bool done, fired;
    pid_t pid;
    int timeout_s;
};

static void *watchdog_main(void *arg) {
    struct watchdog *w = arg;
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += w->timeout_s;
    pthread_mutex_lock(&w->lock);
    while (!w->done) {
        if (pthread_cond_timedwait(&w->cond, &w->lock, &t) == ETIMEDOUT && !w->done) {
            w->fired = true;
            kill(-w->pid, SIGKILL); /* the program's process group */
            kill(w->pid, SIGKILL);
            break;
        }
    }
    pthread_mutex_unlock(&w->lock);
    return NULL;
}

/* Thread group id of task tid, or -1. */
static pid_t tgid_of(pid_t tid) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)tid);
    char *s = read_file(path);
    if (!s) return -1;
    char *p = strstr(s, "\nTgid:");
    pid_t tgid = p ? (pid_t)atoi(p + 6) : -1;
    free(s);
    return tgid;
}

/* At a process's exit stop: does its address space map the library? */
static void check_exiting(struct run *r, pid_t tid, pid_t top) {
    if (tgid_of(tid) != tid) return; /* a thread: its process is checked once */
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/maps", (int)tid);
    char *maps = read_file(path);
    if (!maps || !maps[0]) { /* address space already gone: nothing to judge */
        free(maps);
        return;
    }
    r->procs++;
    if (strstr(maps, g_lib_real) || strstr(maps, LULL_SO_PATH)) {
        r->procs_with_lib++;
        if (tid == top) r->top_with_lib = true;
    } else {
        char exe[PATH_MAX] = "?";
        snprintf(path, sizeof path, "/proc/%d/exe", (int)tid);
        ssize_t n = readlink(path, exe, sizeof exe - 1);
        exe[n > 0 ? n : 1] = 0;
        size_t len = strlen(r->without_lib);
        snprintf(r->without_lib + len, sizeof r->without_lib - len, "%s%s(%d)", len ? ", " : "",
                 exe, (int)tid);
    }
    free(maps);
}

#define MAX_TRACEES 8192

/* Wait for a traced program and everything it starts. */
static void trace_tree(struct run *r, pid_t top) {
    static pid_t known[MAX_TRACEES];
    size_t nknown = 0;
    known[nknown++] = top;
    bool options_set = false;
    for (;;) {
        int st;
        pid_t w = waitpid(-1, &st, __WALL);
        if (w < 0) {
            if (errno == EINTR) continue;
            break; /* ECHILD: every tracee is gone */
        }
        if (WIFEXITED(st) || WIFSIGNALED(st)) {
            if (w == top) r->status = st;
            continue;
        }
        if (!WIFSTOPPED(st)) continue;
        int sig = WSTOPSIG(st), event = (unsigned)st >> 16;
        int deliver = 0;
        if (!options_set && w == top && sig == SIGTRAP) {
            /* The stop after execve: follow everything from here on. */
            ptrace(PTRACE_SETOPTIONS, w, 0,
                   PTRACE_O_TRACEFORK | PTRACE_O_TRACEVFORK | PTRACE_O_TRACECLONE |
                       PTRACE_O_TRACEEXEC | PTRACE_O_TRACEEXIT | PTRACE_O_EXITKILL);
            options_set = true;
        } else if (sig == SIGTRAP && event == PTRACE_EVENT_EXIT) {
            check_exiting(r, w, top);
        } else if (sig == SIGTRAP && event != 0) {
            /* fork, vfork, clone, exec: nothing to do */
        } else if (sig == SIGSTOP) {
            bool seen = false;
            for (size_t i = 0; i < nknown && !seen; i++)
                seen = known[i] == w;
            if (seen)
                deliver = sig;
            else if (nknown < MAX_TRACEES)
                known[nknown++] = w; /* a new tracee's first stop: swallow it */
        } else {
            deliver = sig; /* an ordinary signal: pass it on */
        }
        ptrace(PTRACE_CONT, w, 0, (void *)(intptr_t)deliver);
    }
}

static void run_program(struct run *r) {
    char out_path[PATH_MAX], err_path[PATH_MAX], preload_entry[PATH_MAX + 16];
    snprintf(out_path, sizeof out_path, "%s/%s.out", tmp_dir(), r->tag);
    snprintf(err_path, sizeof err_path, "%s/%s.err", tmp_dir(), r->tag);
    snprintf(preload_entry, sizeof preload_entry, "LD_PRELOAD=%s", LULL_SO_PATH);
    char **env = make_env(r, preload_entry);
    const char *cwd = r->cwd ? r->cwd : tmp_dir();

    int in = open(r->stdin_path ? r->stdin_path : "/dev/null", O_RDONLY | O_CLOEXEC);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    cr_assert(in >= 0 && out >= 0 && err >= 0, "opening the files of %s: %s", r->tag,
              strerror(errno));

    r->status = -1;
    r->timed_out = false;
    r->procs = r->procs_with_lib = 0;
    r->top_with_lib = false;
    r->without_lib[0] = 0;

    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* Only async-signal-safe calls from here to execve. */
        setpgid(0, 0);
        if (chdir(cwd) != 0) _exit(126);
        dup2(in, 0);
        dup2(out, 1);
        dup2(err, 2);
        if (r->preload && ptrace(PTRACE_TRACEME, 0, 0, 0) != 0) _exit(125);
        execve(r->argv[0], (char *const *)r->argv, env);
        _exit(127);
    }
    setpgid(pid, pid); /* also from here, so the watchdog's group kill cannot miss */
    close(in);
    close(out);
    close(err);

    struct watchdog wd = {.lock = PTHREAD_MUTEX_INITIALIZER,
                          .cond = PTHREAD_COND_INITIALIZER,
                          .pid = pid,
                          .timeout_s = r->timeout_s};
    pthread_t wt;
    cr_assert_eq(pthread_create(&wt, NULL, watchdog_main, &wd), 0);
    if (r->preload) {
        trace_tree(r, pid);
    } else {
        int st;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        r->status = st;
    }
    pthread_mutex_lock(&wd.lock);
    wd.done = true;
    pthread_cond_signal(&wd.cond);
    pthread_mutex_unlock(&wd.lock);
    pthread_join(wt, NULL);
    r->timed_out = wd.fired;
    free(env);
    free(r->out);
    free(r->err);
    r->out = read_file(out_path);
    r->err = read_file(err_path);
    if (!r->out) r->out = strdup("");
    if (!r->err) r->err = strdup("");
}

static void run_free(struct run *r) {
    free(r->out);
    free(r->err);
    r->out = r->err = NULL;
}

/* The run finished by itself with exit code 0. */
static void assert_clean_exit(const struct run *r) {
    cr_assert(!r->timed_out, "%s: killed after %d s; stderr ends with:\n%s", r->tag, r->timeout_s,
              tail(r->err, 2000));
    cr_assert(WIFEXITED(r->status), "%s: died of signal %d; stderr ends with:\n%s", r->tag,
              WIFSIGNALED(r->status) ? WTERMSIG(r->status) : -1, tail(r->err, 2000));
    cr_assert_eq(WEXITSTATUS(r->status), 0, "%s: exit code %d; stderr ends with:\n%s", r->tag,
                 WEXITSTATUS(r->status), tail(r->err, 2000));
}

/* Whether the run asked lull to talk (LULL_CONF or LULL_VERBOSE given). */
static bool lull_asked_to_talk(const struct run *r) {
    for (size_t i = 0; r->env && r->env[i]; i++)
        if (!strncmp(r->env[i], "LULL_", 5)) return true;
    return getenv("LULL_CONF") || getenv("LULL_VERBOSE");
}

/* Every process of a preloaded run mapped the library, and lull (when it is
 * lull) wrote nothing of its own on the program's stderr. */
static void assert_preloaded(const struct run *r) {
    cr_assert(r->top_with_lib, "%s: %s was not mapped in the program's process at its exit", r->tag,
              LULL_SO_PATH);
    cr_assert_eq(r->procs_with_lib, r->procs, "%s: %d of %d processes lacked %s: %s", r->tag,
                 r->procs - r->procs_with_lib, r->procs, LULL_SO_PATH, r->without_lib);
    if (!lull_asked_to_talk(r)) {
        const char *m = r->err;
        while (m && strncmp(m, "lull: ", 6) != 0) {
            m = strchr(m, '\n');
            if (m) m++;
        }
        cr_assert(m == NULL, "%s: lull wrote on the program's stderr: %.*s", r->tag,
                  (int)strcspn(m ? m : "", "\n"), m ? m : "");
    }
}

static void run_both(struct run *with, struct run *without) {
    *without = *with;
    without->out = without->err = NULL;
    char tag[128];
    snprintf(tag, sizeof tag, "%s-nopreload", with->tag);
    without->tag = tag;
    without->preload = false;
    run_program(without);
    assert_clean_exit(without);
    without->tag = NULL;
    with->preload = true;
    run_program(with);
    assert_clean_exit(with);
    assert_preloaded(with);
}

/* ---- python3 ------------------------------------------------------------ */

Test(preload, python_workload) {
    REQUIRE_PRELOADABLE_BUILD();
    char py[PATH_MAX];
    if (!find_program("python3", py, sizeof py)) cr_skip_test("python3 is not installed");
    /* Run the interpreter itself, not a wrapper script (pyenv shims are). */
    const char *const ask[] = {py, "-c", "import sys; print(sys.executable)", NULL};
    struct run q = {.argv = ask, .timeout_s = 60, .tag = "python-exe"};
    run_program(&q);
    assert_clean_exit(&q);
    char exe[PATH_MAX];
    snprintf(exe, sizeof exe, "%.*s", (int)strcspn(q.out, "\n"), q.out);
    run_free(&q);
    cr_assert(exe[0] == '/', "sys.executable is not a path: '%s'", exe);

    const char *const argv[] = {exe, LULL_SOURCE_DIR "/tests/programs/py_workload.py", NULL};
    /* PYTHONMALLOC=malloc: every object through malloc, not pymalloc's arenas. */
    const char *const env[] = {"PYTHONMALLOC=malloc", "PYTHONHASHSEED=0", "LC_ALL=C", NULL};
    struct run with = {.argv = argv, .env = env, .timeout_s = 240, .tag = "python"}, without;
    run_both(&with, &without);
    cr_assert(!strncmp(with.out, "checksum ", 9), "python printed: %s", tail(with.out, 500));
    cr_assert_str_eq(with.out, without.out, "python's output differs under the preload");
    run_free(&with);
    run_free(&without);
    g_passed = true;
}

/* ---- sqlite3 ------------------------------------------------------------ */

Test(preload, sqlite3_large_transaction) {
    REQUIRE_PRELOADABLE_BUILD();
    char sqlite[PATH_MAX];
    if (!find_program("sqlite3", sqlite, sizeof sqlite)) cr_skip_test("sqlite3 is not installed");
    const char *sql = LULL_SOURCE_DIR "/tests/programs/sqlite_workload.sql";
    const char *const argv_a[] = {sqlite, "-batch", "-bail", path_in("with.db"), NULL};
    const char *const argv_b[] = {sqlite, "-batch", "-bail", path_in("without.db"), NULL};
    struct run without = {
        .argv = argv_b, .stdin_path = sql, .timeout_s = 240, .tag = "sqlite-nopreload"};
    run_program(&without);
    assert_clean_exit(&without);
    struct run with = {
        .argv = argv_a, .stdin_path = sql, .preload = true, .timeout_s = 240, .tag = "sqlite"};
    run_program(&with);
    assert_clean_exit(&with);
    assert_preloaded(&with);
    cr_assert(strstr(with.out, "\nok\n") != NULL, "no integrity_check 'ok': %s",
              tail(with.out, 500));
    cr_assert_str_eq(with.out, without.out, "sqlite3's output differs under the preload");
    cr_assert_str_eq(with.err, "", "sqlite3 wrote on stderr: %s", tail(with.err, 1000));
    run_free(&with);
    run_free(&without);
    g_passed = true;
}

/* ---- git ---------------------------------------------------------------- */

static uint64_t g_rng;
static uint64_t rnd(void) {
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return g_rng;
}

/* Deterministic text: lines that repeat with variations (deltas find them). */
static void text_file(const char *path, size_t size, unsigned id, unsigned version) {
    char *buf = malloc(size + 128);
    size_t len = 0;
    unsigned line = 0;
    while (len < size) {
        unsigned v = (line % 17 == version % 17) ? version : 0;
        len += (size_t)snprintf(buf + len, 128, "file %u line %u value %08x v%u %s\n", id, line,
                                (unsigned)((id * 2654435761u) ^ (line * 40503u)), v,
                                (line % 5) ? "lorem ipsum dolor" : "sit amet");
        line++;
    }
    write_file(path, buf, size);
    free(buf);
}

static void make_dirs(const char *repo) {
    char p[PATH_MAX];
    for (int d = 0; d < 10; d++) {
        snprintf(p, sizeof p, "%s/d%d", repo, d);
        mkdir(p, 0755);
        snprintf(p, sizeof p, "%s/d%d/sub", repo, d);
        mkdir(p, 0755);
    }
}

static void file_name(char *out, size_t n, const char *repo, unsigned i) {
    snprintf(out, n, "%s/d%u/%sf%u.txt", repo, i % 10, (i % 3) ? "" : "sub/", i);
}

/* The tree of commit c (1..5), made by editing the tree of commit c-1. */
static void make_commit_tree(const char *repo, int c) {
    char p[PATH_MAX], q[PATH_MAX];
    g_rng = 0x9e3779b97f4a7c15ull * (uint64_t)c + 1;
    switch (c) {
    case 1:
        make_dirs(repo);
        for (unsigned i = 0; i < 300; i++) {
            file_name(p, sizeof p, repo, i);
            text_file(p, 200 + rnd() % 20000, i, 1);
        }
        break;
    case 2:
        for (unsigned i = 0; i < 300; i += 3) { /* modify 100 */
            file_name(p, sizeof p, repo, i);
            text_file(p, 200 + rnd() % 30000, i, 2);
        }
        for (unsigned i = 300; i < 360; i++) { /* add 60 */
            file_name(p, sizeof p, repo, i);
            text_file(p, 100 + rnd() % 5000, i, 2);
        }
        break;
    case 3:
        for (unsigned i = 1; i < 300; i += 10) { /* delete 30 */
            file_name(p, sizeof p, repo, i);
            unlink(p);
        }
        for (unsigned i = 2; i < 300; i += 15) { /* rename 20 */
            file_name(p, sizeof p, repo, i);
            file_name(q, sizeof q, repo, i + 1000);
            rename(p, q);
        }
        snprintf(p, sizeof p, "%s/big1.txt", repo);
        text_file(p, 1 << 20, 9001, 3);
        break;
    case 4:
        snprintf(p, sizeof p, "%s/big1.txt", repo);
        text_file(p, (1 << 20) + 4096, 9001, 4);
        snprintf(p, sizeof p, "%s/big2.txt", repo);
        text_file(p, 2 << 20, 9002, 4);
        for (unsigned i = 300; i < 360; i += 1) {
            file_name(p, sizeof p, repo, i);
            text_file(p, 100 + rnd() % 8000, i, 4);
        }
        break;
    case 5:
        for (unsigned i = 0; i < 300; i += 2) {
            file_name(p, sizeof p, repo, i);
            if (access(p, F_OK) == 0) text_file(p, 200 + rnd() % 20000, i, 5);
        }
        break;
    }
}

struct git_ctx {
    char git[PATH_MAX];
    char repo[512];
    const char *env[16];
    char home[PATH_MAX + 8];
    bool preload;
    const char *label;
    int step;
    char tag[96];
};

/* Run git with args (NULL-terminated) in the repository. */
static void git_run(struct git_ctx *g, struct run *r, ...) {
    const char *argv[32];
    int n = 0;
    argv[n++] = g->git;
    argv[n++] = "-c";
    argv[n++] = "gc.auto=0"; /* nothing detaches into the background */
    argv[n++] = "-c";
    argv[n++] = "pack.threads=2";
    va_list ap;
    va_start(ap, r);
    const char *a;
    while ((a = va_arg(ap, const char *)) != NULL && n < 31)
        argv[n++] = a;
    va_end(ap);
    argv[n] = NULL;
    snprintf(g->tag, sizeof g->tag, "git-%s-%02d-%s", g->label, g->step++, argv[5]);
    memset(r, 0, sizeof *r);
    r->argv = argv;
    r->env = g->env;
    r->preload = g->preload;
    r->cwd = g->repo;
    r->timeout_s = 120;
    r->tag = g->tag;
    run_program(r);
    assert_clean_exit(r);
    if (g->preload) assert_preloaded(r);
    r->argv = NULL; /* argv was on this stack frame */
}

/* Builds the repository and returns what is compared between the runs. */
static char *git_session(struct git_ctx *g) {
    int n = 0;
    g->env[n++] = "GIT_CONFIG_NOSYSTEM=1";
    g->env[n++] = "GIT_AUTHOR_NAME=lull test";
    g->env[n++] = "GIT_AUTHOR_EMAIL=lull@example.invalid";
    g->env[n++] = "GIT_AUTHOR_DATE=2024-01-02T03:04:05Z";
    g->env[n++] = "GIT_COMMITTER_NAME=lull test";
    g->env[n++] = "GIT_COMMITTER_EMAIL=lull@example.invalid";
    g->env[n++] = "GIT_COMMITTER_DATE=2024-01-02T03:04:05Z";
    g->env[n++] = "LC_ALL=C";
    g->env[n++] = "TZ=UTC";
    g->env[n++] = "GIT_PAGER=cat";
    snprintf(g->home, sizeof g->home, "HOME=%s", tmp_dir());
    g->env[n++] = g->home;
    g->env[n++] = "XDG_CONFIG_HOME=/nonexistent";
    g->env[n] = NULL;

    struct run r = {0};
    cr_assert_eq(mkdir(g->repo, 0755), 0, "mkdir %s: %s", g->repo, strerror(errno));
    git_run(g, &r, "init", "-q", "-b", "main", ".", NULL);
    run_free(&r);
    for (int c = 1; c <= 5; c++) {
        make_commit_tree(g->repo, c);
        git_run(g, &r, "add", "-A", NULL);
        run_free(&r);
        char msg[32];
        snprintf(msg, sizeof msg, "commit %d", c);
        git_run(g, &r, "commit", "-q", "-m", msg, NULL);
        run_free(&r);
    }

    size_t cap = 1 << 20, len = 0;
    char *keep = malloc(cap);
    keep[0] = 0;
#define KEEP(r)                                                                                    \
    do {                                                                                           \
        size_t l = strlen((r).out);                                                                \
        while (len + l + 64 > cap)                                                                 \
            keep = realloc(keep, cap *= 2);                                                        \
        len += (size_t)sprintf(keep + len, "==== step %d\n", g->step - 1);                         \
        memcpy(keep + len, (r).out, l + 1);                                                        \
        len += l;                                                                                  \
    } while (0)

    git_run(g, &r, "log", "--stat", "--format=%H %T %an %s", NULL);
    cr_assert(strstr(r.out, "commit 5") && strstr(r.out, "commit 1"), "git log: %s",
              tail(r.out, 500));
    KEEP(r);
    run_free(&r);
    git_run(g, &r, "diff", "--stat", "-M", "HEAD~4", "HEAD", NULL);
    KEEP(r);
    run_free(&r);
    git_run(g, &r, "blame", "-s", "big1.txt", NULL);
    KEEP(r);
    run_free(&r);
    git_run(g, &r, "gc", "--quiet", NULL);
    run_free(&r);
    git_run(g, &r, "fsck", "--full", "--strict", "--no-progress", NULL);
    cr_assert_str_eq(r.out, "", "git fsck reported: %s", tail(r.out, 1000));
    cr_assert_str_eq(r.err, "", "git fsck reported: %s", tail(r.err, 1000));
    run_free(&r);
    git_run(g, &r, "count-objects", "-v", NULL);
    cr_assert(strstr(r.out, "count: 0\n") && strstr(r.out, "packs: 1\n"),
              "objects are not all in one pack after gc: %s", r.out);
    run_free(&r);
    git_run(g, &r, "ls-tree", "-r", "-l", "HEAD", NULL);
    KEEP(r);
    run_free(&r);
    git_run(g, &r, "rev-list", "--objects", "--all", NULL);
    KEEP(r);
    run_free(&r);
#undef KEEP
    return keep;
}

Test(preload, git_repository) {
    REQUIRE_PRELOADABLE_BUILD();
    struct git_ctx with, without;
    memset(&with, 0, sizeof with);
    if (!find_program("git", with.git, sizeof with.git)) cr_skip_test("git is not installed");
    without = with;
    snprintf(without.repo, sizeof without.repo, "%s/repo-nopreload", tmp_dir());
    without.label = "nopreload";
    char *ref = git_session(&without);
    snprintf(with.repo, sizeof with.repo, "%s/repo", tmp_dir());
    with.label = "preload";
    with.preload = true;
    char *got = git_session(&with);
    cr_assert(strlen(ref) > 10000, "suspiciously little git output (%zu bytes)", strlen(ref));
    cr_assert(strcmp(got, ref) == 0, "git's output differs under the preload (outputs in %s)",
              tmp_dir());
    free(ref);
    free(got);
    g_passed = true;
}

/* ---- tests/programs ----------------------------------------------------- */

static void built_program(char *out, size_t n, const char *name) {
    snprintf(out, n, "%s/tests/prog_%s", LULL_BUILD_DIR, name);
    cr_assert(access(out, X_OK) == 0, "%s was not built", out);
}

Test(preload, threaded_churn) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "threaded_churn");
    const char *const argv[] = {prog, "8", NULL};
    struct run with = {.argv = argv, .timeout_s = 240, .tag = "churn"}, without;
    run_both(&with, &without);
    cr_assert(!strncmp(with.out, "OK ", 3), "threaded_churn printed: %s", with.out);
    cr_assert_str_eq(with.out, without.out, "the checksum differs under the preload");
    run_free(&with);
    run_free(&without);
    g_passed = true;
}

/* What forgetting the parent's purge ring and refault monitor costs a fork
 * child in page faults (each some 14 us on a PVM guest, 4 on a Firecracker
 * one): tests/programs/fork_faults.c prints the fewest faults a child took
 * before lull's reclaim thread existed and once it had opened both, in one
 * process (one layout). Allowed: one for the reclaim thread's descriptor,
 * which glibc's child handler writes, and one of margin. Before the
 * refault monitor's after-fork code and data joined base/fork_exec.h's
 * group and the child's closes went around libc's wrapper, a child took
 * 4-5 more. */
Test(preload, a_fork_child_takes_few_page_faults_of_lull) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "fork_faults");
    const char *const argv[] = {prog, NULL};
    struct run r = {.argv = argv, .preload = true, .timeout_s = 120, .tag = "fork_faults"};
    run_program(&r);
    assert_clean_exit(&r);
    assert_preloaded(&r);
    long before = -1, after = -1;
    cr_assert_eq(sscanf(r.out, "before %ld after %ld", &before, &after), 2, "it printed: %s",
                 r.out);
    cr_expect_leq(after, before + 2,
                  "a fork child took %ld page faults once lull's thread had opened its ring "
                  "and refault monitor, %ld before",
                  after, before);
    run_free(&r);
    g_passed = true;
}

Test(preload, cxx_newdelete) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "cxx_newdelete");
    const char *const argv[] = {prog, NULL};
    struct run with = {.argv = argv, .timeout_s = 240, .tag = "cxx"}, without;
    run_both(&with, &without);
    cr_assert(!strncmp(with.out, "OK ", 3), "cxx_newdelete printed: %s", with.out);
    cr_assert_str_eq(with.out, without.out, "the checksum differs under the preload");
    run_free(&with);
    run_free(&without);
    g_passed = true;
}

/* ---- the preload really replaces the allocator ---------------------------- */

/* The dynamic linker's own account: with LD_DEBUG=bindings it logs, for each
 * symbol it resolves, which object supplied it. Every allocator entry point
 * the program and its libraries use must come from the library, none from
 * libc or libstdc++. LD_BIND_NOW makes the main thread resolve every symbol
 * at start-up: with lazy binding the worker threads race to resolve them,
 * and a CI run once missed a binding line that way. */
struct bindings {
    const char *const *syms; /* in: the symbols to check */
    size_t nsyms;
    const char *from;    /* in: a library whose bindings of syms[0] must be seen, e.g. "/libc.so.6"
                          * (NULL: none) */
    bool prog_bound[16]; /* out: the program's binding of syms[i] was logged */
    bool from_bound;     /* out: the library's binding of syms[0] was logged */
};

/* The LD_DEBUG log a run with LD_DEBUG_OUTPUT=<tmp_dir()>/ld wrote: the
 * traced process's is ld.<pid>, and there is exactly one (malloc'd). */
static char *ld_debug_log(void) {
    char *log = NULL;
    DIR *d = opendir(tmp_dir());
    cr_assert(d != NULL);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (strncmp(e->d_name, "ld.", 3) != 0) continue;
        cr_assert(log == NULL, "more than one LD_DEBUG log");
        log = read_file(path_in(e->d_name));
    }
    closedir(d);
    cr_assert(log != NULL, "no LD_DEBUG log: LD_DEBUG is not honoured here");
    return log;
}

static void check_bindings(const char *prog, const char *const *argv, struct bindings *b) {
    cr_assert_leq(b->nsyms, sizeof b->prog_bound / sizeof b->prog_bound[0]);
    char out_env[PATH_MAX + 32];
    snprintf(out_env, sizeof out_env, "LD_DEBUG_OUTPUT=%s/ld", tmp_dir());
    const char *const env[] = {"LD_DEBUG=bindings", "LD_BIND_NOW=1", out_env, NULL};
    struct run r = {.argv = argv, .env = env, .preload = true, .timeout_s = 120, .tag = "bindings"};
    run_program(&r);
    assert_clean_exit(&r);
    assert_preloaded(&r);

    char *log = ld_debug_log();

    char from[64];
    snprintf(from, sizeof from, "%s [", b->from ? b->from : "");
    for (char *line = strtok(log, "\n"); line; line = strtok(NULL, "\n")) {
        char *bf = strstr(line, "binding file ");
        if (!bf) continue;
        char *to = strstr(bf, "] to ");
        char *sym = strstr(bf, ": normal symbol `");
        if (!to || !sym) continue;
        sym += strlen(": normal symbol `");
        size_t symlen = strcspn(sym, "'");
        for (size_t i = 0; i < b->nsyms; i++) {
            if (strlen(b->syms[i]) != symlen || strncmp(sym, b->syms[i], symlen) != 0) continue;
            char *dest = to + 5;
            size_t destlen = strcspn(dest, " ");
            char destpath[PATH_MAX], destreal[PATH_MAX];
            snprintf(destpath, sizeof destpath, "%.*s", (int)destlen, dest);
            if (!realpath(destpath, destreal)) snprintf(destreal, sizeof destreal, "%s", destpath);
            cr_assert_str_eq(destreal, g_lib_real, "%s bound to %s, not to the library: %s",
                             b->syms[i], destpath, line);
            bf += strlen("binding file ");
            if (!strncmp(bf, prog, strlen(prog)) && bf[strlen(prog)] == ' ')
                b->prog_bound[i] = true;
            if (b->from && strstr(bf, from) && i == 0) b->from_bound = true;
        }
    }
    for (size_t i = 0; i < b->nsyms; i++)
        cr_expect(b->prog_bound[i],
                  "no binding of the program's %s was logged (program %s, log %s)", b->syms[i],
                  prog, tmp_dir());
    if (b->from)
        cr_expect(b->from_bound, "%s's own %s calls are not bound to the library", b->from,
                  b->syms[0]);
    free(log);
    run_free(&r);
}

Test(preload, allocator_symbols_bind_to_the_library) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "threaded_churn");
    const char *const argv[] = {prog, "2", "50", NULL};
    static const char *const syms[] = {"malloc",   "free",           "calloc",
                                       "realloc",  "posix_memalign", "aligned_alloc",
                                       "memalign", "valloc",         "malloc_usable_size"};
    struct bindings b = {.syms = syms, .nsyms = sizeof syms / sizeof syms[0], .from = "/libc.so.6"};
    check_bindings(prog, argv, &b);
    g_passed = true;
}

/* glibc's <malloc.h> calls of a program that knows nothing of lull come
 * from the library too (src/glibc_malloc.c). */
Test(preload, glibc_malloc_calls_bind_to_the_library) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "glibc_calls");
    /* LD_BIND_NOW binds every call at start: none need be made (and
     * malloc_stats would talk on stderr, which assert_preloaded refuses) */
    const char *const argv[] = {prog, "--bind-only", NULL};
    static const char *const syms[] = {"malloc_trim", "mallinfo2", "mallinfo", "malloc_stats",
                                       "malloc_info"};
    struct bindings b = {.syms = syms, .nsyms = sizeof syms / sizeof syms[0]};
    check_bindings(prog, argv, &b);
    g_passed = true;
}

/* glibc's __libc_* malloc calls (__libc_malloc, __libc_free, ...) of a
 * program that knows nothing of lull come from the library too: code
 * written for glibc mixes them with malloc and free. */
Test(preload, libc_names_bind_to_the_library) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "libc_names");
    const char *const argv[] = {prog, "--bind-only", NULL};
    static const char *const syms[] = {LIBC_NAMES};
    struct bindings b = {.syms = syms, .nsyms = sizeof syms / sizeof syms[0]};
    check_bindings(prog, argv, &b);
    g_passed = true;
}

/* The blocks cross between those names and malloc's (each block made by
 * one family is freed or grown by the other): with the names glibc's,
 * __libc_free(malloc(100)) handed lull's block to glibc's free, which
 * aborted ("free(): invalid pointer"). */
Test(preload, libc_names_mix_with_malloc_and_free) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "libc_names");
    const char *const argv[] = {prog, NULL};
    struct run with = {.argv = argv, .timeout_s = 60, .tag = "libc_names"}, without;
    run_both(&with, &without);
    cr_assert_str_eq(without.out, "OK\n", "libc_names printed without the preload: %s",
                     without.out);
    cr_assert_str_eq(with.out, "OK\n", "libc_names printed under the preload: %s", with.out);
    run_free(&with);
    run_free(&without);
    g_passed = true;
}

/* The figure `key` of tests/programs/glibc_calls.c's output ("key value"). */
static unsigned long long figure(const char *out, const char *key) {
    char want[64];
    snprintf(want, sizeof want, "\n%s ", key);
    const char *at = !strncmp(out, want + 1, strlen(want + 1)) ? out - 1 : strstr(out, want);
    cr_assert_not_null(at, "no %s in the output:\n%s", key, out);
    return strtoull(at + strlen(want), NULL, 10);
}

/* What those calls answer under the preload: lull's heap. Purging is off,
 * so only the trim gives the 40 MiB block and the small blocks back: it
 * says so (1) and RSS drops over it; glibc's would return whatever its
 * main arena had, with the block unmapped at its free. */
Test(preload, glibc_malloc_calls_describe_lull_s_heap) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "glibc_calls");
    const char *const argv[] = {prog, NULL};
    const char *const env[] = {"LULL_CONF=purge_delay_ms=never", NULL};
    struct run r = {.argv = argv, .env = env, .preload = true, .timeout_s = 60, .tag = "glibc"};
    run_program(&r);
    assert_clean_exit(&r);
    assert_preloaded(&r);
    const unsigned long long big = 40ull << 20, small = 512ull * 4000;
    cr_expect_geq(figure(r.out, "held_uordblks"), figure(r.out, "start_uordblks") + small);
    cr_expect_geq(figure(r.out, "held_hblkhd"), figure(r.out, "start_hblkhd") + big);
    cr_expect_eq(figure(r.out, "held_hblks"), figure(r.out, "start_hblks") + 1);
    cr_expect_eq(figure(r.out, "held_int_hblkhd"), figure(r.out, "held_hblkhd"));
    cr_expect_eq(figure(r.out, "held_arena"),
                 figure(r.out, "held_uordblks") + figure(r.out, "held_fordblks"));
    cr_expect_leq(figure(r.out, "freed_uordblks") + small, figure(r.out, "held_uordblks"));
    cr_expect_eq(figure(r.out, "trim"), 1, "malloc_trim(0) after 42 MiB were freed");
    cr_expect_leq(figure(r.out, "rss_after_trim") + big, figure(r.out, "rss_before_trim"),
                  "RSS did not drop by the 40 MiB block over the trim:\n%s", r.out);
    cr_expect_lt(figure(r.out, "trimmed_keepcost"), big);
    cr_expect_not_null(strstr(r.out, "<malloc version=\"1\" allocator=\"lull\""),
                       "malloc_info wrote:\n%s", r.out);
    cr_expect_not_null(strstr(r.out, "</malloc>\n"), "malloc_info wrote:\n%s", r.out);
    cr_expect_not_null(strstr(r.err, ": mapped "), "malloc_stats wrote:\n%s", r.err);
    cr_expect_null(strstr(r.err, "Arena 0:"), "glibc's malloc_stats:\n%s", r.err);
    run_free(&r);
    g_passed = true;
}

/* A C++ program's new and delete, plain, array, sized, aligned and nothrow,
 * come from the library (src/cxx_operators.c), and so do libstdc++'s own
 * calls of operator new. */
Test(preload, cxx_operators_bind_to_the_library) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "cxx_newdelete");
    const char *const argv[] = {prog, "2", "20", NULL};
    static const char *const syms[] = {"_Znwm",
                                       "_Znam",
                                       "_ZnwmRKSt9nothrow_t",
                                       "_ZnwmSt11align_val_t",
                                       "_ZnamSt11align_val_t",
                                       "_ZdlPv",
                                       "_ZdaPv",
                                       "_ZdlPvm",
                                       "_ZdaPvm",
                                       "_ZdlPvSt11align_val_t",
                                       "_ZdlPvmSt11align_val_t",
                                       "_ZdaPvmSt11align_val_t",
                                       "_ZdlPvRKSt9nothrow_t"};
    struct bindings b = {
        .syms = syms, .nsyms = sizeof syms / sizeof syms[0], .from = "/libstdc++.so.6"};
    check_bindings(prog, argv, &b);
    g_passed = true;
}

/* ---- a PATH search before the first allocation --------------------------- */

/* One exec of tests/programs/exec_first.c (`how` FILE, PATH=path_env), with
 * and without the preload: the same exit status, output and errors, and
 * the status expected. Before the fix the preloaded run's execvp, execvpe
 * and execlp failed with ENOSYS (exit 127): lull's wrappers had not yet
 * looked the C library's up. */
static void exec_first_case(const char *how, const char *file, const char *path_env,
                            int want_status, const char *want_out, const char *want_err) {
    char prog[PATH_MAX], tag[64], tag_without[80];
    built_program(prog, sizeof prog, "exec_first");
    static int cases;
    snprintf(tag, sizeof tag, "exec-%s-%d", how, ++cases); /* file may hold a '/' */
    snprintf(tag_without, sizeof tag_without, "%s-nopreload", tag);
    const char *const argv[] = {prog, how, file, NULL};
    const char *const env[] = {path_env, NULL};
    struct run without = {.argv = argv, .env = env, .timeout_s = 60, .tag = tag_without};
    struct run with = without;
    with.tag = tag;
    with.preload = true;
    run_program(&without);
    run_program(&with);
    cr_assert(!with.timed_out && !without.timed_out, "%s %s: killed after 60 s", how, file);
    cr_assert(WIFEXITED(without.status) && WEXITSTATUS(without.status) == want_status,
              "%s %s without the preload: status %#x, not exit %d; stderr:\n%s", how, file,
              without.status, want_status, tail(without.err, 1000));
    cr_assert(WIFEXITED(with.status) && WEXITSTATUS(with.status) == want_status,
              "%s %s under the preload: status %#x, not exit %d as without it; stderr:\n%s", how,
              file, with.status, want_status, tail(with.err, 1000));
    cr_assert_str_eq(with.out, want_out, "%s %s: stdout under the preload", how, file);
    cr_assert_str_eq(without.out, want_out, "%s %s: stdout without the preload", how, file);
    cr_assert_str_eq(with.err, want_err, "%s %s: stderr under the preload", how, file);
    cr_assert_str_eq(without.err, want_err, "%s %s: stderr without the preload", how, file);
    assert_preloaded(&with);
    run_free(&with);
    run_free(&without);
}

static void write_program(const char *path, const char *text, mode_t mode) {
    write_file(path, text, strlen(text));
    cr_assert_eq(chmod(path, mode), 0, "chmod %s: %s", path, strerror(errno));
}

/* execvp, execvpe and execlp as a program's first act (/usr/bin/time
 * does it): found on PATH, a script without #! (the shell runs it), a
 * file that is not executable ahead of one that is, and the errors
 * (ENOENT, EACCES), each as the C library gives them. */
Test(preload, path_search_exec_before_the_first_allocation) {
    REQUIRE_PRELOADABLE_BUILD();
    char first[PATH_MAX], second[PATH_MAX], path_env[3 * PATH_MAX];
    snprintf(first, sizeof first, "%s", path_in("bin1"));
    snprintf(second, sizeof second, "%s", path_in("bin2"));
    cr_assert(mkdir(first, 0755) == 0 && mkdir(second, 0755) == 0, "mkdir: %s", strerror(errno));
    char f[PATH_MAX + 32];
    snprintf(f, sizeof f, "%s/lull-script", first);
    write_program(f, "echo script ran with $# arguments\n", 0755);
    snprintf(f, sizeof f, "%s/lull-shadowed", first);
    write_program(f, "echo the first, not executable\n", 0644);
    snprintf(f, sizeof f, "%s/lull-shadowed", second);
    write_program(f, "echo the second\n", 0755);
    snprintf(f, sizeof f, "%s/lull-noexec", second);
    write_program(f, "echo never\n", 0644);
    snprintf(path_env, sizeof path_env, "PATH=%s:%s:/usr/bin:/bin", first, second);

    static const char *const hows[] = {"execvp", "execvpe", "execlp"};
    for (size_t i = 0; i < sizeof hows / sizeof hows[0]; i++) {
        exec_first_case(hows[i], "true", path_env, 0, "", "");
        exec_first_case(hows[i], "lull-script", path_env, 0, "script ran with 0 arguments\n", "");
        exec_first_case(hows[i], "lull-shadowed", path_env, 0, "the second\n", "");
        exec_first_case(hows[i], "lull-missing", path_env, 127, "", "exec_first: errno 2\n");
        exec_first_case(hows[i], "lull-noexec", path_env, 127, "", "exec_first: errno 13\n");
        exec_first_case(hows[i], "/bin/true", path_env, 0, "", "");
    }
    g_passed = true;
}

/* ---- what the library exports ------------------------------------------- */

/* Whether a dynamic symbol of liblull.so is part of its interface: the
 * lull_* API, the malloc family (with glibc's malloc_trim, mallinfo,
 * mallinfo2, malloc_stats and malloc_info, and its __libc_* names of the
 * family), the C++ operators (_Znw*, _Zna*, _Zdl*,
 * _Zda*) and the exec and exit wrappers of src/counter_page.c. */
static bool lull_interface_symbol(const char *name) {
    static const char *const names[] = {"malloc",
                                        "free",
                                        "calloc",
                                        "realloc",
                                        "reallocarray",
                                        "posix_memalign",
                                        "aligned_alloc",
                                        "memalign",
                                        "valloc",
                                        "pvalloc",
                                        "malloc_usable_size",
                                        "free_sized",
                                        "free_aligned_sized",
                                        "malloc_trim",
                                        "mallinfo",
                                        "mallinfo2",
                                        "malloc_stats",
                                        "malloc_info",
                                        LIBC_NAMES,
                                        "cfree",
                                        "execl",
                                        "execle",
                                        "execlp",
                                        "execv",
                                        "execve",
                                        "execveat",
                                        "execvp",
                                        "execvpe",
                                        "fexecve",
                                        "_exit",
                                        "_Exit"};
    if (!strncmp(name, "lull_", 5)) return true;
    if (!strncmp(name, "_Znw", 4) || !strncmp(name, "_Zna", 4) || !strncmp(name, "_Zdl", 4) ||
        !strncmp(name, "_Zda", 4))
        return true;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (!strcmp(name, names[i])) return true;
    return false;
}

/* A preloaded library comes first in every lookup: anything else it
 * exports replaces the program's own. liblull.so exported liburing's 60
 * functions (it links liburing.a in), so a server's io_uring_* calls ran
 * lull's copy, built against another liburing than the server's perhaps. */
Test(preload, the_library_exports_its_interface_only) {
    REQUIRE_PRELOADABLE_BUILD();
    /* readelf: nm -D lists hidden entries too, which no lookup binds to */
    FILE *syms = popen("readelf --dyn-syms -W '" LULL_SO_PATH "'", "r");
    cr_assert_not_null(syms, "popen readelf: %s", strerror(errno));
    char line[1024], others[2048] = "";
    size_t n = 0, foreign = 0;
    while (fgets(line, sizeof line, syms)) {
        char bind[16], vis[16], ndx[16], name[512];
        if (sscanf(line, " %*[0-9]: %*s %*s %*s %15s %15s %15s %511s", bind, vis, ndx, name) != 4)
            continue;
        if (!strcmp(ndx, "UND") || !strcmp(bind, "LOCAL") || !strcmp(vis, "HIDDEN") ||
            !strcmp(vis, "INTERNAL"))
            continue;
        n++;
        char *version = strchr(name, '@');
        if (version) *version = 0;
        if (lull_interface_symbol(name)) continue;
        if (foreign++ < 12) {
            size_t len = strlen(others);
            snprintf(others + len, sizeof others - len, " %s", name);
        }
    }
    cr_assert_eq(pclose(syms), 0, "readelf --dyn-syms failed");
    cr_assert_gt(n, 20, "readelf listed %zu exported symbols of %s", n, LULL_SO_PATH);
    cr_assert_eq(foreign, 0, "%s exports %zu symbols that are not lull's:%s%s", LULL_SO_PATH,
                 foreign, others, foreign > 12 ? " ..." : "");
    g_passed = true;
}

/* The harm itself: a program that uses the system's liburing.so gets its
 * functions under the preload, and its ring works. */
Test(preload, a_program_with_its_own_io_uring_binds_to_its_liburing) {
    REQUIRE_PRELOADABLE_BUILD();
    char prog[PATH_MAX], out_env[PATH_MAX + 32];
    built_program(prog, sizeof prog, "uring_user");
    snprintf(out_env, sizeof out_env, "LD_DEBUG_OUTPUT=%s/ld", tmp_dir());
    const char *const argv[] = {prog, NULL};
    const char *const env[] = {"LD_DEBUG=bindings", "LD_BIND_NOW=1", out_env, NULL};
    struct run r = {.argv = argv, .env = env, .preload = true, .timeout_s = 60, .tag = "uring"};
    run_program(&r);
    assert_clean_exit(&r);
    assert_preloaded(&r);
    cr_assert_str_eq(r.out, "OK\n", "uring_user printed: %s", r.out);
    char *log = ld_debug_log();
    static const char *const syms[] = {"io_uring_queue_init", "io_uring_submit",
                                       "io_uring_queue_exit"};
    for (size_t i = 0; i < sizeof syms / sizeof syms[0]; i++) {
        char want[128];
        snprintf(want, sizeof want, ": normal symbol `%s'", syms[i]);
        bool seen = false;
        for (char *line = log; line && *line;) {
            char *end = strchr(line, '\n');
            if (end) *end = 0;
            char *bf = strstr(line, "binding file ");
            if (bf && strstr(line, want) && !strncmp(bf + 13, prog, strlen(prog))) {
                seen = true;
                cr_assert_not_null(strstr(line, "/liburing.so"), "%s is not liburing's: %s",
                                   syms[i], line);
            }
            if (end) *end = '\n';
            line = end ? end + 1 : NULL;
        }
        cr_assert(seen, "no binding of the program's %s was logged (log in %s)", syms[i],
                  tmp_dir());
    }
    free(log);
    run_free(&r);
    g_passed = true;
}

/* lull's own banner: with LULL_CONF=verbose=1 it says "lull: <version> active". */
Test(preload, lull_banner_with_verbose) {
    REQUIRE_PRELOADABLE_BUILD();
    const char *base = strrchr(LULL_SO_PATH, '/');
    base = base ? base + 1 : LULL_SO_PATH;
    if (strncmp(base, "liblull", 7) != 0)
        cr_skip_test("LULL_SO_PATH is %s, not lull: no banner to check", LULL_SO_PATH);
    char prog[PATH_MAX];
    built_program(prog, sizeof prog, "threaded_churn");
    const char *const argv[] = {prog, "1", "10", NULL};
    const char *const env[] = {"LULL_CONF=verbose=1", NULL};
    struct run r = {.argv = argv, .env = env, .preload = true, .timeout_s = 120, .tag = "banner"};
    run_program(&r);
    assert_clean_exit(&r);
    assert_preloaded(&r);
    /* "lull: 0.1.0 active" or "lull: lull 0.1.0 active (pid 123)". */
    regex_t re;
    cr_assert_eq(regcomp(&re, "^lull: (lull )?v?[0-9]+\\.[0-9]+[^ ]* active",
                         REG_EXTENDED | REG_NEWLINE | REG_NOSUB),
                 0);
    bool found = regexec(&re, r.err, 0, NULL, 0) == 0;
    regfree(&re);
    cr_assert(found, "no \"lull: <version> active\" line on stderr:\n%s", tail(r.err, 2000));
    run_free(&r);
    g_passed = true;
}

/* The proof itself can fail: a process of the run that drops LD_PRELOAD is
 * caught at its exit, while the processes that kept it pass. */
Test(preload, harness_notices_a_process_without_the_library) {
    REQUIRE_PRELOADABLE_BUILD();
    const char *const argv[] = {"/bin/sh", "-c", "env -u LD_PRELOAD /bin/sh -c 'exit 0'; exit 0",
                                NULL};
    struct run r = {.argv = argv, .preload = true, .timeout_s = 60, .tag = "harness"};
    run_program(&r);
    assert_clean_exit(&r);
    cr_expect(r.top_with_lib, "the top shell should map the library");
    cr_expect_eq(r.procs, 2, "expected the shell and its child: %d processes seen", r.procs);
    cr_expect_eq(r.procs - r.procs_with_lib, 1, "exactly one process lacks it, not %d (%s)",
                 r.procs - r.procs_with_lib, r.without_lib);
    cr_expect(strstr(r.without_lib, "sh") != NULL, "the culprit is the inner sh: %s",
              r.without_lib);
    run_free(&r);
    g_passed = true;
}
