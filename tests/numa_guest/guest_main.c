/* /init of the guest: sets up the console, /proc and /sys, runs every
 * registered check in its own child process, prints the results on the
 * serial console and powers the machine off. See guest.h for the protocol.
 * Also runs outside a guest (not as PID 1) for a quick try on the host:
 * then it mounts nothing and just exits. */
#define _GNU_SOURCE
#include "guest.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define TAG "LULL-GUEST: "
#define DEFAULT_TIMEOUT_S 60

extern const struct guest_check __start_guest_checks[], __stop_guest_checks[];

static char *detail_page; /* shared with the check's child */
static const char *current_check = "";

uint64_t guest_now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

void guest_detail(const char *fmt, ...) {
    if (!detail_page) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail_page, 4096, fmt, ap);
    va_end(ap);
    for (char *s = detail_page; *s; s++)
        if (*s == '\n' || *s == '\r') *s = ' ';
}

const char *guest_detail_text(void) {
    return detail_page ? detail_page : "";
}

void guest_info(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    printf(TAG "INFO %s: %s\n", current_check, buf);
    fflush(stdout);
}

const char *guest_param(const char *key, char *buf, size_t len) {
    char cmdline[4096];
    const char *env = getenv("LULL_GUEST_CMDLINE"); /* a try on the host */
    if (env) {
        snprintf(cmdline, sizeof cmdline, "%s", env);
    } else {
        int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
        if (fd < 0) return NULL;
        ssize_t n = read(fd, cmdline, sizeof cmdline - 1);
        close(fd);
        if (n <= 0) return NULL;
        cmdline[n] = '\0';
    }
    char pat[128];
    snprintf(pat, sizeof pat, "lull_guest.%s=", key);
    for (char *p = cmdline; (p = strstr(p, pat)) != NULL; p++) {
        if (p != cmdline && p[-1] != ' ') continue;
        p += strlen(pat);
        size_t l = strcspn(p, " \n");
        if (l >= len) l = len - 1;
        memcpy(buf, p, l);
        buf[l] = '\0';
        return buf;
    }
    return NULL;
}

bool guest_pin_cpu(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) return false;
    for (int i = 0; i < 1000 && sched_getcpu() != cpu; i++)
        sched_yield();
    return sched_getcpu() == cpu;
}

struct on_cpu {
    int cpu;
    int (*fn)(void *);
    void *arg;
    int result;
};

static void *on_cpu_thread(void *p) {
    struct on_cpu *o = p;
    if (!guest_pin_cpu(o->cpu)) {
        guest_detail("cannot pin a thread to cpu %d", o->cpu);
        o->result = GUEST_FAIL;
        return NULL;
    }
    o->result = o->fn(o->arg);
    return NULL;
}

int guest_on_cpu(int cpu, int (*fn)(void *), void *arg) {
    struct on_cpu o = {cpu, fn, arg, GUEST_FAIL};
    pthread_t t;
    if (pthread_create(&t, NULL, on_cpu_thread, &o) != 0) {
        guest_detail("pthread_create failed");
        return GUEST_FAIL;
    }
    pthread_join(t, NULL);
    return o.result;
}

void *guest_map(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

void guest_touch(void *p, size_t len) {
    for (size_t off = 0; off < len; off += 4096)
        ((volatile char *)p)[off] = 1;
}

/* ---- init duties ---- */

static void setup_pid1(void) {
    mkdir("/dev", 0755);
    mount("devtmpfs", "/dev", "devtmpfs", 0, NULL);
    int fd = open("/dev/console", O_RDWR);
    if (fd < 0) fd = open("/dev/ttyS0", O_RDWR);
    if (fd >= 0) {
        dup2(fd, 0);
        dup2(fd, 1);
        dup2(fd, 2);
        if (fd > 2) close(fd);
    }
    mkdir("/proc", 0755);
    mount("proc", "/proc", "proc", 0, NULL);
    mkdir("/sys", 0755);
    mount("sysfs", "/sys", "sysfs", 0, NULL);
    mkdir("/tmp", 01777);
    mount("tmpfs", "/tmp", "tmpfs", 0, NULL);
}

static void power_off(void) {
    fflush(stdout);
    fflush(stderr);
    sync();
    reboot(RB_POWER_OFF);
    /* Not reached; if it were, PID 1 must not exit (kernel panic). */
    for (;;)
        pause();
}

/* name is one of the comma list */
static bool in_list(const char *name, const char *list) {
    size_t n = strlen(name);
    for (const char *p = list; *p;) {
        size_t l = strcspn(p, ",");
        if (l == n && strncmp(p, name, n) == 0) return true;
        p += l;
        if (*p == ',') p++;
    }
    return false;
}

/* lull_guest.only= names checks (of any group); else lull_guest.group=
 * names groups ("all": every one); neither: every check. */
static bool selected(const struct guest_check *c, const char *only, const char *groups) {
    if (only && *only) return in_list(c->name, only);
    if (!groups || !*groups || in_list("all", groups)) return true;
    return in_list(c->group, groups);
}

static int run_check(const struct guest_check *c, char *status_detail, size_t len) {
    int timeout = c->timeout_s > 0 ? c->timeout_s : DEFAULT_TIMEOUT_S;
    detail_page[0] = '\0';
    current_check = c->name;
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) {
        snprintf(status_detail, len, "fork failed: %s", strerror(errno));
        return GUEST_FAIL;
    }
    if (pid == 0) {
        alarm((unsigned)timeout);
        int r = c->run();
        fflush(stdout);
        _exit(r == GUEST_PASS || r == GUEST_SKIP ? r : GUEST_FAIL);
    }
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
    }
    int result;
    if (WIFEXITED(st)) {
        int code = WEXITSTATUS(st);
        result = code == GUEST_PASS ? GUEST_PASS : code == GUEST_SKIP ? GUEST_SKIP : GUEST_FAIL;
        snprintf(status_detail, len, "%s", detail_page);
    } else {
        int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
        result = GUEST_FAIL;
        if (sig == SIGALRM)
            snprintf(status_detail, len, "timed out after %d s; last: %s", timeout, detail_page);
        else
            snprintf(status_detail, len, "died of signal %d (%s); last: %s", sig, strsignal(sig),
                     detail_page);
    }
    current_check = "";
    return result;
}

static uint64_t uptime_ms(void) {
    char buf[64];
    int fd = open("/proc/uptime", O_RDONLY);
    if (fd < 0) return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return 0;
    buf[n] = '\0';
    return (uint64_t)(strtod(buf, NULL) * 1000);
}

static int by_file_line(const void *a, const void *b) {
    const struct guest_check *x = *(const struct guest_check *const *)a;
    const struct guest_check *y = *(const struct guest_check *const *)b;
    int c = strcmp(x->file, y->file);
    return c ? c : x->line - y->line;
}

int main(void) {
    bool pid1 = getpid() == 1;
    if (pid1) setup_pid1();
    setvbuf(stdout, NULL, _IOLBF, 0);
    detail_page = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (detail_page == MAP_FAILED) detail_page = NULL;

    struct utsname u;
    uname(&u);
    char only[512], groups[128];
    const char *sel = guest_param("only", only, sizeof only);
    const char *sel_groups = guest_param("group", groups, sizeof groups);
    /* The linker keeps the section in no useful order: sort. */
    enum { MAX_CHECKS = 256 };
    const struct guest_check *list[MAX_CHECKS];
    int count = 0;
    for (const struct guest_check *c = __start_guest_checks; c < __stop_guest_checks; c++)
        if (selected(c, sel, sel_groups) && count < MAX_CHECKS) list[count++] = c;
    qsort(list, (size_t)count, sizeof list[0], by_file_line);
    printf(TAG "BEGIN kernel=%s cpus=%ld checks=%d boot_ms=%llu\n", u.release,
           sysconf(_SC_NPROCESSORS_ONLN), count, (unsigned long long)uptime_ms());

    int passed = 0, failed = 0, skipped = 0;
    for (int i = 0; i < count; i++) {
        const struct guest_check *c = list[i];
        char detail[4200];
        uint64_t t0 = guest_now_ms();
        int r = detail_page ? run_check(c, detail, sizeof detail) : GUEST_FAIL;
        if (!detail_page) snprintf(detail, sizeof detail, "no shared page");
        uint64_t ms = guest_now_ms() - t0;
        const char *s = r == GUEST_PASS ? "PASS" : r == GUEST_SKIP ? "SKIP" : "FAIL";
        passed += r == GUEST_PASS;
        failed += r == GUEST_FAIL;
        skipped += r == GUEST_SKIP;
        printf(TAG "CHECK %s %s %llums %s\n", c->name, s, (unsigned long long)ms, detail);
    }
    if (count == 0) failed++; /* nothing ran: never a pass */
    printf(TAG "SUMMARY passed=%d failed=%d skipped=%d uptime_ms=%llu\n", passed, failed, skipped,
           (unsigned long long)uptime_ms());
    printf(TAG "END\n");
    if (pid1) power_off();
    return failed ? 1 : 0;
}
