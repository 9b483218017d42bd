/* Syscall watcher: per-thread seccomp filters with SECCOMP_RET_USER_NOTIF and
 * one supervisor thread that records each watched call and lets it continue.
 * See syscall_watch.h. */
#define _GNU_SOURCE
#include "syscall_watch.h"

#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#ifndef __x86_64__
#error "syscall_watch: the filter is written for x86-64"
#endif

#ifndef SECCOMP_USER_NOTIF_FLAG_CONTINUE
#define SECCOMP_USER_NOTIF_FLAG_CONTINUE (1UL << 0)
#endif
#ifndef __X32_SYSCALL_BIT
#define __X32_SYSCALL_BIT 0x40000000
#endif

#define NR_MMAP 9
#define NR_MADVISE 28
#define NR_MUNMAP 11
#define NR_MREMAP 25
#define NR_IO_URING_SETUP 425
#define NR_IO_URING_ENTER 426
#define NR_IO_URING_REGISTER 427
#define NR_PROCESS_MADVISE 440
#define I386_NR_MUNMAP 91
#define I386_NR_MREMAP 163
#define I386_NR_MADVISE 219

#define MAX_THREADS 1024
#define SLOT_FREE (-1)
#define SLOT_RESERVED (-2)

struct watched_thread {
    pid_t tid;
    bool done;
    uintptr_t stack_lo, stack_hi; /* guard page included; 0, 0 if unknown */
};

/* Everything below is guarded by g_lock unless it is atomic. */
static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond = PTHREAD_COND_INITIALIZER; /* slots and sync progress */
static bool g_started;
static bool g_poisoned;    /* forked from a watched thread: no supervisor possible */
static int g_wake_fd = -1; /* eventfd the supervisor polls besides the listeners */
/* atomic: a newly watched thread stores its listener without g_lock (see
 * install()) */
static _Atomic int g_listeners[SYSCALL_WATCH_MAX_LISTENERS] = {
    [0 ... SYSCALL_WATCH_MAX_LISTENERS - 1] = SLOT_FREE};
static struct watched_thread g_threads[MAX_THREADS];
static size_t g_nthreads, g_thread_cursor;
static struct syscall_watch_event g_events[SYSCALL_WATCH_MAX_EVENTS];
static size_t g_nevents;         /* stored */
static _Atomic size_t g_all;     /* recorded, stored or not */
static _Atomic size_t g_counted; /* recorded and not exempt */
static uint64_t g_sync_req, g_sync_done;
static _Atomic int g_installs; /* filters installed in this process */

static __thread bool t_installed;
/* The calling thread's registry entry and tid, so that
 * syscall_watch_thread_done() needs no lock and no call (a thread that
 * watches every call must not wait for the supervisor inside g_lock). */
static __thread struct watched_thread *t_self;
static __thread pid_t t_tid;

/* Code of shared sanitizer runtimes, found once at start. */
#define MAX_RUNTIME_RANGES 16
static uintptr_t g_runtime_lo[MAX_RUNTIME_RANGES], g_runtime_hi[MAX_RUNTIME_RANGES];
static int g_nruntime;

static pid_t my_tid(void) {
    return (pid_t)syscall(SYS_gettid);
}

static struct timespec realtime_after_ms(long ms) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    t.tv_sec += ms / 1000;
    t.tv_nsec += (ms % 1000) * 1000000L;
    if (t.tv_nsec >= 1000000000L) {
        t.tv_sec++;
        t.tv_nsec -= 1000000000L;
    }
    return t;
}

static void wake_supervisor(void) {
    uint64_t one = 1;
    if (g_wake_fd >= 0) {
        ssize_t r = write(g_wake_fd, &one, sizeof one);
        (void)r;
    }
}

/* ---- thread registry (for exemptions) ---------------------------------- */

static struct watched_thread *thread_find(pid_t tid) {
    for (size_t i = 0; i < g_nthreads; i++)
        if (g_threads[i].tid == tid) return &g_threads[i];
    return NULL;
}

/* Find or add tid; a new entry replaces the oldest one when the table is
 * full. Caller holds g_lock. */
static struct watched_thread *thread_get(pid_t tid) {
    struct watched_thread *t = thread_find(tid);
    if (t) return t;
    if (g_nthreads < MAX_THREADS) {
        t = &g_threads[g_nthreads++];
    } else {
        t = &g_threads[g_thread_cursor];
        g_thread_cursor = (g_thread_cursor + 1) % MAX_THREADS;
    }
    memset(t, 0, sizeof *t);
    t->tid = tid;
    return t;
}

/* The calling thread's stack, guard area included (glibc's exit path
 * madvises from the start of the stack block, guard included). */
static void own_stack(uintptr_t *lo, uintptr_t *hi) {
    pthread_attr_t attr;
    void *addr;
    size_t size, guard = 0;
    *lo = *hi = 0;
    if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
    if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
        pthread_attr_getguardsize(&attr, &guard);
        *lo = (uintptr_t)addr - guard;
        *hi = (uintptr_t)addr + size;
    }
    pthread_attr_destroy(&attr);
}

/* ---- sanitizer runtimes ------------------------------------------------- */

static void find_runtimes(void) {
    static const char *const names[] = {"libasan", "libtsan", "libubsan", "liblsan", "libhwasan"};
    FILE *f = fopen("/proc/self/maps", "re");
    if (!f) return;
    char line[1024];
    g_nruntime = 0;
    while (fgets(line, sizeof line, f) && g_nruntime < MAX_RUNTIME_RANGES) {
        unsigned long lo, hi;
        char perms[8];
        int off = 0;
        if (sscanf(line, "%lx-%lx %7s %*s %*s %*s %n", &lo, &hi, perms, &off) < 3 || !off) continue;
        if (perms[2] != 'x') continue;
        const char *path = line + off, *base = strrchr(path, '/');
        base = base ? base + 1 : path;
        for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
            if (!strncmp(base, names[i], strlen(names[i]))) {
                g_runtime_lo[g_nruntime] = lo;
                g_runtime_hi[g_nruntime++] = hi;
                break;
            }
        }
    }
    fclose(f);
}

static bool in_runtime(uint64_t ip) {
    for (int i = 0; i < g_nruntime; i++)
        if (ip >= g_runtime_lo[i] && ip < g_runtime_hi[i]) return true;
    return false;
}

/* ---- recording ---------------------------------------------------------- */

static unsigned classify(const struct seccomp_notif *n) {
    unsigned flags = 0;
    long nr = n->data.nr;
    if (n->data.arch != AUDIT_ARCH_X86_64 || (nr & __X32_SYSCALL_BIT))
        flags |= SYSCALL_WATCH_FOREIGN;
    if (in_runtime(n->data.instruction_pointer)) flags |= SYSCALL_WATCH_RUNTIME;
    struct watched_thread *t = thread_find((pid_t)n->pid);
    if (t) {
        if (__atomic_load_n(&t->done, __ATOMIC_RELAXED)) flags |= SYSCALL_WATCH_AFTER_DONE;
        if (n->data.arch == AUDIT_ARCH_X86_64 && (nr & ~(long)__X32_SYSCALL_BIT) == NR_MADVISE &&
            t->stack_hi != 0) {
            uint64_t a = n->data.args[0], len = n->data.args[1];
            if (a >= t->stack_lo && a + len <= t->stack_hi && a + len >= a)
                flags |= SYSCALL_WATCH_OWN_STACK;
        }
    }
    return flags;
}

static void record(const struct seccomp_notif *n) {
    pthread_mutex_lock(&g_lock);
    unsigned flags = classify(n);
    size_t seq = atomic_load(&g_all);
    if (g_nevents < SYSCALL_WATCH_MAX_EVENTS) {
        struct syscall_watch_event *e = &g_events[g_nevents++];
        e->seq = seq;
        e->tid = (pid_t)n->pid;
        e->arch = n->data.arch;
        e->nr = n->data.nr;
        for (int i = 0; i < 6; i++)
            e->args[i] = n->data.args[i];
        e->ip = n->data.instruction_pointer;
        e->flags = flags;
    }
    atomic_store(&g_all, seq + 1);
    if (!(flags & SYSCALL_WATCH_EXEMPT)) atomic_fetch_add(&g_counted, 1);
    pthread_mutex_unlock(&g_lock);
}

/* Receive one notification from fd, record it, let the call continue.
 * Returns false when nothing could be received. */
static bool handle_one(int fd) {
    struct seccomp_notif req;
    memset(&req, 0, sizeof req); /* the kernel insists on a zeroed buffer */
    if (ioctl(fd, SECCOMP_IOCTL_NOTIF_RECV, &req) != 0) return false; /* ENOENT: caller gone */
    record(&req);
    struct seccomp_notif_resp resp;
    memset(&resp, 0, sizeof resp);
    resp.id = req.id;
    resp.flags = SECCOMP_USER_NOTIF_FLAG_CONTINUE;
    /* ENOENT: the caller was interrupted; it will retry and notify again. */
    (void)ioctl(fd, SECCOMP_IOCTL_NOTIF_SEND, &resp);
    return true;
}

/* ---- supervisor --------------------------------------------------------- */

static int snapshot(struct pollfd *pfd, int *slot) {
    int n = 0;
    pthread_mutex_lock(&g_lock);
    for (int i = 0; i < SYSCALL_WATCH_MAX_LISTENERS; i++) {
        if (g_listeners[i] >= 0) {
            pfd[n].fd = g_listeners[i];
            pfd[n].events = POLLIN;
            pfd[n].revents = 0;
            slot[n++] = i;
        }
    }
    pthread_mutex_unlock(&g_lock);
    return n;
}

static void drop_listener(int slot, int fd) {
    pthread_mutex_lock(&g_lock);
    if (g_listeners[slot] == fd) {
        g_listeners[slot] = SLOT_FREE;
        close(fd);
    }
    pthread_cond_broadcast(&g_cond);
    pthread_mutex_unlock(&g_lock);
}

/* Handle everything pending right now on every listener. */
static void drain(void) {
    struct pollfd pfd[SYSCALL_WATCH_MAX_LISTENERS];
    int slot[SYSCALL_WATCH_MAX_LISTENERS];
    for (;;) {
        int n = snapshot(pfd, slot);
        if (n == 0 || poll(pfd, (nfds_t)n, 0) <= 0) return;
        bool any = false;
        for (int i = 0; i < n; i++)
            if (pfd[i].revents & POLLIN) any |= handle_one(pfd[i].fd);
        if (!any) return;
    }
}

static void *supervisor(void *arg) {
    (void)arg;
    struct pollfd pfd[SYSCALL_WATCH_MAX_LISTENERS + 1];
    int slot[SYSCALL_WATCH_MAX_LISTENERS + 1];
    for (;;) {
        int n = snapshot(pfd + 1, slot + 1);
        pfd[0].fd = g_wake_fd;
        pfd[0].events = POLLIN;
        pfd[0].revents = 0;
        int r = poll(pfd, (nfds_t)n + 1, 1000);
        if (r < 0) continue;
        if (pfd[0].revents & POLLIN) {
            uint64_t v;
            ssize_t rr = read(g_wake_fd, &v, sizeof v);
            (void)rr;
        }
        for (int i = 1; i <= n; i++) {
            short ev = pfd[i].revents;
            if (ev & POLLIN)
                handle_one(pfd[i].fd);
            else if (ev & (POLLHUP | POLLERR | POLLNVAL))
                drop_listener(slot[i], pfd[i].fd); /* all its threads are gone */
        }
        pthread_mutex_lock(&g_lock);
        uint64_t want = g_sync_req;
        pthread_mutex_unlock(&g_lock);
        if (want != g_sync_done) {
            drain();
            pthread_mutex_lock(&g_lock);
            g_sync_done = want;
            pthread_cond_broadcast(&g_cond);
            pthread_mutex_unlock(&g_lock);
        }
    }
    return NULL;
}

static void atfork_child(void) {
    /* Threads are not copied: the child has no supervisor. If the forking
     * thread was watched, the child's calls still go to the parent's
     * listener, and a supervisor started here would inherit the filter. */
    g_poisoned = atomic_load(&g_installs) > 0 && prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 2;
    g_started = false;
    for (int i = 0; i < SYSCALL_WATCH_MAX_LISTENERS; i++) {
        if (g_listeners[i] >= 0) close(g_listeners[i]);
        g_listeners[i] = SLOT_FREE;
    }
    if (g_wake_fd >= 0) close(g_wake_fd);
    g_wake_fd = -1;
    g_nevents = g_nthreads = g_thread_cursor = 0;
    atomic_store(&g_all, 0);
    atomic_store(&g_counted, 0);
    g_sync_req = g_sync_done = 0;
    pthread_mutex_init(&g_lock, NULL);
    pthread_cond_init(&g_cond, NULL);
}

int syscall_watch_start(void) {
    static bool atfork_done;
    pthread_mutex_lock(&g_lock);
    if (g_started) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    if (g_poisoned || t_installed) {
        pthread_mutex_unlock(&g_lock);
        errno = EDEADLK;
        return -1;
    }
    if (!atfork_done) {
        pthread_atfork(NULL, NULL, atfork_child);
        atfork_done = true;
    }
    find_runtimes();
    g_wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (g_wake_fd < 0) {
        int e = errno;
        pthread_mutex_unlock(&g_lock);
        errno = e;
        return -1;
    }
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    pthread_t th;
    int rc = pthread_create(&th, &attr, supervisor, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        close(g_wake_fd);
        g_wake_fd = -1;
        pthread_mutex_unlock(&g_lock);
        errno = rc;
        return -1;
    }
    pthread_setname_np(th, "syscall-watch");
    g_started = true;
    pthread_mutex_unlock(&g_lock);
    return 0;
}

/* ---- installing --------------------------------------------------------- */

/* What a filter reports on x86-64: the base set plus `extra`, or (all_but)
 * every call except those in `extra`. i386 calls: the base set. */
struct watch_spec {
    const long *extra;
    size_t n;
    bool all_but;
};

#define MAX_EXTRA 16

static int build_filter(struct sock_filter *f, const struct watch_spec *spec) {
    static const uint32_t base[] = {NR_MADVISE,          NR_MUNMAP,         NR_MREMAP,
                                    NR_PROCESS_MADVISE,  NR_IO_URING_SETUP, NR_IO_URING_ENTER,
                                    NR_IO_URING_REGISTER};
    static const uint32_t i386[] = {I386_NR_MADVISE,     I386_NR_MUNMAP,    I386_NR_MREMAP,
                                    NR_PROCESS_MADVISE,  NR_IO_URING_SETUP, NR_IO_URING_ENTER,
                                    NR_IO_URING_REGISTER};
    enum { NB = sizeof base / sizeof base[0], NI = sizeof i386 / sizeof i386[0] };
    uint32_t x64[NB + MAX_EXTRA];
    int nx = 0;
    if (!spec->all_but)
        for (int i = 0; i < NB; i++)
            x64[nx++] = base[i];
    for (size_t i = 0; i < spec->n && i < MAX_EXTRA; i++)
        x64[nx++] = (uint32_t)spec->extra[i];
    int n = 0, jx[NB + MAX_EXTRA], ji[NI];
    f[n++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    int j_arch64 = n++, j_arch32 = n++;
    int x64_start = n;
    f[n++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    /* x32 calls carry __X32_SYSCALL_BIT and the same numbers for these. */
    f[n++] = (struct sock_filter)BPF_STMT(BPF_ALU | BPF_AND | BPF_K, ~(uint32_t)__X32_SYSCALL_BIT);
    for (int i = 0; i < nx; i++)
        jx[i] = n++;
    /* the x86-64 calls not in the list */
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, spec->all_but ? SECCOMP_RET_USER_NOTIF
                                                                         : SECCOMP_RET_ALLOW);
    int i386_start = n;
    f[n++] =
        (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    for (int i = 0; i < NI; i++)
        ji[i] = n++;
    int allow = n;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    int notify = n;
    f[n++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_USER_NOTIF);

#define JUMP(at, k, t, e)                                                                          \
    (f[at] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (k), (uint8_t)((t) - (at)-1), \
                                          (uint8_t)((e) - (at)-1)))
    JUMP(j_arch64, AUDIT_ARCH_X86_64, x64_start, j_arch32);
    /* An unknown architecture is reported whatever the call. */
    JUMP(j_arch32, AUDIT_ARCH_I386, i386_start, notify);
    for (int i = 0; i < nx; i++)
        JUMP(jx[i], x64[i], spec->all_but ? allow : notify, jx[i] + 1);
    for (int i = 0; i < NI; i++)
        JUMP(ji[i], i386[i], notify, ji[i] + 1);
#undef JUMP
    return n;
}

static void register_thread(uintptr_t lo, uintptr_t hi) {
    pid_t tid = my_tid();
    pthread_mutex_lock(&g_lock);
    struct watched_thread *t = thread_get(tid);
    __atomic_store_n(&t->done, false, __ATOMIC_RELAXED);
    t->stack_lo = lo;
    t->stack_hi = hi;
    t_self = t;
    t_tid = tid;
    pthread_mutex_unlock(&g_lock);
}

static int install(const struct watch_spec *spec) {
    if (t_installed) return 0;
    if (spec->n > MAX_EXTRA) {
        errno = E2BIG;
        return -1;
    }
    if (syscall_watch_start() != 0) return -1;

    /* Everything that might allocate or call a watched syscall is done
     * before the filter goes on. */
    uintptr_t lo, hi;
    own_stack(&lo, &hi);
    struct sock_filter filter[64];
    struct sock_fprog prog = {.len = (unsigned short)build_filter(filter, spec), .filter = filter};

    /* Reserve a listener slot first: once the filter is on, the thread must
     * not wait for anything the supervisor does not do by itself. */
    pthread_mutex_lock(&g_lock);
    int slot = -1;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += 5;
    for (;;) {
        for (int i = 0; i < SYSCALL_WATCH_MAX_LISTENERS && slot < 0; i++)
            if (g_listeners[i] == SLOT_FREE) slot = i;
        if (slot >= 0) break;
        /* Full: wait for the supervisor to close listeners whose threads
         * have exited. */
        wake_supervisor();
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > deadline.tv_sec ||
            (now.tv_sec == deadline.tv_sec && now.tv_nsec >= deadline.tv_nsec)) {
            pthread_mutex_unlock(&g_lock);
            errno = ENOSPC;
            return -1;
        }
        struct timespec rt = realtime_after_ms(20); /* g_cond waits on CLOCK_REALTIME */
        pthread_cond_timedwait(&g_cond, &g_lock, &rt);
    }
    g_listeners[slot] = SLOT_RESERVED;
    pthread_mutex_unlock(&g_lock);
    /* before the filter: with every call watched, a call made after it
     * (gettid, a futex for g_lock) would wait for a supervisor that does
     * not poll this thread's listener yet */
    register_thread(lo, hi);

    int fd =
        (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    if (fd < 0 && errno == EACCES) {
        /* Without CAP_SYS_ADMIN a filter needs no_new_privs. */
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
            fd = (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER,
                              SECCOMP_FILTER_FLAG_NEW_LISTENER, &prog);
    }
    int err = errno;
    if (fd < 0) {
        pthread_mutex_lock(&g_lock);
        g_listeners[slot] = SLOT_FREE;
        pthread_mutex_unlock(&g_lock);
        if (err == EBUSY && prctl(PR_GET_SECCOMP, 0, 0, 0, 0) == 2 &&
            atomic_load(&g_installs) > 0) {
            /* One listener per filter chain: this thread inherited a watch
             * filter from the thread that created it and is watched already. */
            return 0;
        }
        errno = err;
        return -1;
    }
    atomic_fetch_add(&g_installs, 1);
    t_installed = true;
    /* no g_lock: the slot is reserved for us, and its futex could wait on
     * the supervisor, which does not poll this listener yet */
    atomic_store(&g_listeners[slot], fd);
    /* poll the new listener from now on (with every call watched, this
     * write itself waits for the supervisor's next round, up to 1 s) */
    wake_supervisor();
    return 0;
}

int syscall_watch_install_on_this_thread(void) {
    return install(&(struct watch_spec){0});
}

int syscall_watch_install_also(const long *extra, size_t n) {
    return install(&(struct watch_spec){extra, n, false});
}

int syscall_watch_install_all_but(const long *allowed, size_t n) {
    return install(&(struct watch_spec){allowed, n, true});
}

int syscall_watch_installed_here(void) {
    return t_installed;
}

void syscall_watch_thread_done(void) {
    if (t_self && __atomic_load_n(&t_self->tid, __ATOMIC_RELAXED) == t_tid) {
        __atomic_store_n(&t_self->done, true, __ATOMIC_RELAXED);
        return;
    }
    pthread_mutex_lock(&g_lock);
    thread_get(my_tid())->done = true;
    pthread_mutex_unlock(&g_lock);
}

/* ---- reading ------------------------------------------------------------ */

size_t syscall_watch_count(void) {
    return atomic_load(&g_counted);
}
size_t syscall_watch_count_all(void) {
    return atomic_load(&g_all);
}

size_t syscall_watch_count_tid(pid_t tid) {
    size_t n = 0;
    pthread_mutex_lock(&g_lock);
    for (size_t i = 0; i < g_nevents; i++)
        if (g_events[i].tid == tid && !(g_events[i].flags & SYSCALL_WATCH_EXEMPT)) n++;
    pthread_mutex_unlock(&g_lock);
    return n;
}

size_t syscall_watch_get(struct syscall_watch_event *out, size_t max) {
    pthread_mutex_lock(&g_lock);
    size_t n = g_nevents < max ? g_nevents : max;
    memcpy(out, g_events, n * sizeof *out);
    pthread_mutex_unlock(&g_lock);
    return n;
}

void syscall_watch_reset(void) {
    pthread_mutex_lock(&g_lock);
    g_nevents = 0;
    atomic_store(&g_all, 0);
    atomic_store(&g_counted, 0);
    pthread_mutex_unlock(&g_lock);
}

int syscall_watch_sync(int timeout_ms) {
    pthread_mutex_lock(&g_lock);
    if (!g_started) {
        pthread_mutex_unlock(&g_lock);
        return 0;
    }
    uint64_t want = ++g_sync_req;
    wake_supervisor();
    struct timespec deadline = realtime_after_ms(timeout_ms);
    int rc = 0;
    while (g_sync_done < want && rc == 0)
        rc = pthread_cond_timedwait(&g_cond, &g_lock, &deadline);
    bool ok = g_sync_done >= want;
    pthread_mutex_unlock(&g_lock);
    if (ok) return 0;
    errno = ETIMEDOUT;
    return -1;
}

const char *syscall_watch_name(long nr) {
    static __thread char buf[32];
    switch (nr & ~(long)__X32_SYSCALL_BIT) {
    case NR_MMAP:
        return "mmap";
    case NR_MADVISE:
        return "madvise";
    case NR_MUNMAP:
        return "munmap";
    case NR_MREMAP:
        return "mremap";
    case NR_PROCESS_MADVISE:
        return "process_madvise";
    case NR_IO_URING_SETUP:
        return "io_uring_setup";
    case NR_IO_URING_ENTER:
        return "io_uring_enter";
    case NR_IO_URING_REGISTER:
        return "io_uring_register";
    default:
        snprintf(buf, sizeof buf, "syscall_%ld", nr);
        return buf;
    }
}

void syscall_watch_dump(int all) {
    static struct syscall_watch_event ev[256];
    size_t n = syscall_watch_get(ev, 256);
    fprintf(stderr, "syscall_watch: %zu counted, %zu recorded\n", syscall_watch_count(),
            syscall_watch_count_all());
    for (size_t i = 0; i < n; i++) {
        const struct syscall_watch_event *e = &ev[i];
        if (!all && (e->flags & SYSCALL_WATCH_EXEMPT)) continue;
        fprintf(stderr, "  #%llu tid %d %s(0x%llx, 0x%llx, 0x%llx, 0x%llx) ip 0x%llx%s%s%s%s\n",
                (unsigned long long)e->seq, (int)e->tid, syscall_watch_name(e->nr),
                (unsigned long long)e->args[0], (unsigned long long)e->args[1],
                (unsigned long long)e->args[2], (unsigned long long)e->args[3],
                (unsigned long long)e->ip,
                (e->flags & SYSCALL_WATCH_OWN_STACK) ? " [own stack]" : "",
                (e->flags & SYSCALL_WATCH_AFTER_DONE) ? " [after done]" : "",
                (e->flags & SYSCALL_WATCH_FOREIGN) ? " [foreign abi]" : "",
                (e->flags & SYSCALL_WATCH_RUNTIME) ? " [sanitizer runtime]" : "");
    }
}
