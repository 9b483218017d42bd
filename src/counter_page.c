/* The counter page writer; see counter_page.h and include/lull/counters.h.
 * lull is the allocator: nothing here may allocate (no malloc, no stdio).
 * The page is reached with shm_open/ftruncate/mmap, /proc and /dev/shm are
 * read with open/read/getdents64 into stack buffers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "src/counter_page.h"
#include "base/no_cancel.h"
#include "lull.h"
#include "base/decimal.h"
#include "base/fault.h"
#include "base/message.h"
#include "base/exec_search.h"
#include "base/fork_exec.h"
#include "base/race.h"

#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define NAME_MAX_LEN 200
/* The inode of the initial PID namespace (PROC_PID_INIT_INO, fixed since
 * Linux 3.8): pages of its processes keep the plain name lull.<pid>. */
#define PIDNS_INIT UINT64_C(0xEFFFFFFC)
/* Bounds of the sweep of /dev/shm when a page is created. */
#define SWEEP_MAX_ENTRIES 4096
#define SWEEP_MAX_PAGES 256
/* The object: the published struct, then the request block. */
#define PAGE_BYTES ((size_t)LULL_COUNTERS_FILE_SIZE)

/* The state a fork child resets and its exit and exec wrappers read, with
 * the rest of what a fork+exec touches (base/fork_exec.h). */

/* The mapping, published with seq_cst so that close and publish agree on
 * who may touch it (see counter_page_close). */
static LULL_FORK_EXEC_DATA struct lull_counters *page;
/* Number of counter_page_publish() calls that may be using `page`. */
static LULL_FORK_EXEC_DATA int publishing;
static LULL_FORK_EXEC_DATA char page_name[NAME_MAX_LEN + 2];
static LULL_FORK_EXEC_DATA pid_t page_owner;
/* The thread that opened the page: its only writer. */
static pthread_t page_writer;
static uint64_t page_size_cached;
/* The mapping is MADV_DONTFORK: a fork child does not have it. */
static LULL_FORK_EXEC_DATA bool page_dontfork;
/* The last profile_request value answered (the writer's own copy: the
 * page's profile_done is never read back). 0 for a new page, which is
 * zero-filled. Only the writer touches it. */
static LULL_FORK_EXEC_DATA uint64_t request_served;

/* The life-cycle gate between the page's creation (on the reclaim thread)
 * and the ends of the process (exit, _exit, exec on any thread): `opening`
 * while counter_page_open() creates a page, `ending` while a thread is on
 * its way out. Each sets its own flag, then looks at the other's (seq_cst,
 * Dekker): an open that sees `ending` gives up, an end that sees `opening`
 * waits for the open to finish (for a second at most), and then finds the
 * page and removes it. So no page is created that an end does not remove. */
static LULL_FORK_EXEC_DATA int opening, ending;
/* Held across an open and a sweep, and by fork's prepare handler: the object's
 * descriptor holds the page's lock (flock, which a fork child shares) until
 * the open closes it, and the mapping is kept from fork children only once
 * the open has made it. A child copied in between kept both, and with them
 * its parent's lock and page (tests/test_race_counter_page_open.c). An
 * open takes no other lock of lull's and allocates nothing. */
static LULL_FORK_EXEC_DATA pthread_mutex_t open_lock = PTHREAD_MUTEX_INITIALIZER;
/* An exec failed, or an open gave up because of one: open again. */
static LULL_FORK_EXEC_DATA int reopen_wanted;
/* This process as lull knows it: set at start and in a fork child. A
 * vfork child (or a raw clone) runs on the parent's memory with another
 * pid: it must not touch the parent's page or flags. */
static LULL_FORK_EXEC_DATA pid_t self_pid;

/* Start time (field 22 of a /proc/.../stat file, clock ticks after boot).
 * Returns 0, -ESRCH if there is no such process or it is a zombie (it will
 * never publish again), or -EIO if the file is unreadable. */
static int stat_start_time(const char *path, uint64_t *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT || errno == ESRCH ? -ESRCH : -EIO;
    char buf[1024];
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return len == 0 ? -ESRCH : -EIO;
    buf[len] = '\0';

    /* "pid (comm) S ppid ...": comm may hold spaces and ')', the fields
     * after the last ')' are numbers. Field 3 (state) follows it. */
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -EIO;
    p += 2;
    if (*p == 'Z' || *p == 'X' || *p == 'x') return -ESRCH;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -EIO;
        p++;
    }
    uint64_t v = 0;
    if (*p < '0' || *p > '9') return -EIO;
    while (*p >= '0' && *p <= '9')
        v = v * 10 + (uint64_t)(*p++ - '0');
    *out = v;
    return 0;
}

/* The same for a pid as /proc shows it. */
static int proc_start_time(uint64_t pid, uint64_t *out) {
    char path[48] = "/proc/";
    size_t n = strlen(path);
    n += lull_format_u64(path + n, pid);
    memcpy(path + n, "/stat", sizeof "/stat");
    return stat_start_time(path, out);
}

/* This process's PID namespace (the inode of /proc/self/ns/pid), 0 if
 * unknown (no /proc). /proc/self is this process whichever PID namespace
 * the /proc mount belongs to. */
static uint64_t own_pidns(void) {
    struct stat st;
    return stat("/proc/self/ns/pid", &st) == 0 ? (uint64_t)st.st_ino : 0;
}

/* strerror() may allocate (unknown errors, message catalogs): the untranslated
 * descriptions from glibc's table never do. */
static const char *err_text(int e) {
    const char *d = strerrordesc_np(e);
    return d ? d : "unknown error";
}

static void sleep_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

/* ------------------------------------------------------------ staleness */

/* What a name says about its page: lull.<pid> is a page of the initial PID
 * namespace (or of a lull that did not name namespaces); lull.<pid>.<ns>
 * a page of PID namespace <ns>, written by a lull that locks its page; any
 * other name was chosen with counter_page=NAME. */
enum name_kind { NAME_PLAIN, NAME_PIDNS, NAME_OTHER };

static bool all_digits(const char *s, size_t n) {
    if (n == 0 || n > 20) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

/* name: without the leading '/'. */
static enum name_kind name_kind_of(const char *name) {
    if (strncmp(name, "lull.", 5) != 0) return NAME_OTHER;
    const char *p = name + 5, *dot = strchr(p, '.');
    if (!dot) return all_digits(p, strlen(p)) ? NAME_PLAIN : NAME_OTHER;
    return all_digits(p, (size_t)(dot - p)) && all_digits(dot + 1, strlen(dot + 1)) ? NAME_PIDNS
                                                                                    : NAME_OTHER;
}

/* Is the writer of an open page alive? Every lull that writes pages holds an
 * exclusive flock on it (through its mapping) from before its header is
 * written until its process exits, execs or is killed: the kernel drops it
 * then, in every PID namespace. 1 locked, 0 not (the caller then holds a
 * shared lock until it closes fd), -1 cannot tell. */
static int page_locked(int fd) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) return 0;
    return errno == EWOULDBLOCK ? 1 : -1;
}

/* An unlocked page (its header names pid and start): is it stale? A lull
 * that names namespaces locks its page, so an unlocked lull.<pid>.<ns> is
 * stale. Other pages may be an older lull's, which did not lock: judged by
 * their (pid, start time) as /proc shows them, which is meaningful for a
 * plain name only in the initial PID namespace. A page of this very pid is
 * this process's before an exec (exec keeps pid and start time but runs no
 * exit handler; no page of ours is open when this is asked). A process that
 * runs on after an exec lull could not see (a raw execve system call) keeps
 * its page until it ends. When in doubt: not stale. */
static bool unlocked_page_stale(enum name_kind kind, uint64_t pid, uint64_t start) {
    if (kind == NAME_PIDNS) return true;
    if (kind == NAME_PLAIN && own_pidns() != PIDNS_INIT) return false;
    uint64_t now, own;
    if (stat_start_time("/proc/self/stat", &own) != 0) return false; /* no /proc to judge by */
    if (pid == (uint64_t)getpid()) return true;
    int r = proc_start_time(pid, &now);
    if (r == -ESRCH) return true;
    return r == 0 && now != start;
}

/* ---------------------------------------------------------------- open */

enum existing { EXISTING_GONE, EXISTING_LIVE, EXISTING_ERROR };

static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISDIR(mode)) return "a directory";
    return "not a regular file";
}

/* The name is taken: remove it if it is a stale counter page of this user
 * (its lull header names a process that no longer runs). Anything else at
 * the name is left alone, and the page is not created: lull never removes
 * what it did not create (another program's object or semaphore, another
 * user's file, a FIFO or a symlink that someone put at the predictable
 * default name). */
static enum existing handle_existing(const char *name, int *err) {
    /* O_NONBLOCK: a FIFO must not block the open (on the reclaim thread,
     * for ever); O_NOFOLLOW: a symlink fails with ELOOP */
    int fd = shm_open(name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0) {
        if (errno == ENOENT) return EXISTING_GONE; /* removed meanwhile: retry */
        *err = errno;
        lull_message("counter page %s exists and cannot be read (%s): not creating it", name,
                     err_text(errno));
        return EXISTING_ERROR;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        *err = errno;
        close(fd);
        lull_message("counter page %s exists and cannot be examined (%s): not creating it", name,
                     err_text(*err));
        return EXISTING_ERROR;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        *err = EEXIST;
        lull_message("counter page %s exists and is %s, not a regular file: leaving it alone; no "
                     "counter page",
                     name, file_kind(st.st_mode));
        return EXISTING_ERROR;
    }
    if (st.st_uid != geteuid()) {
        close(fd);
        *err = EEXIST;
        lull_message("counter page %s exists and belongs to uid %u, not to this process's uid "
                     "%u: leaving it alone; no counter page",
                     name, (unsigned)st.st_uid, (unsigned)geteuid());
        return EXISTING_ERROR;
    }
    /* A live creator writes the header right after creating the object:
     * give it a moment before judging a header-less object. */
    uint64_t hdr[5] = {0};
    for (int i = 0; i < 20; i++) {
        ssize_t r = pread(fd, hdr, sizeof hdr, 0);
        if (r == (ssize_t)sizeof hdr && hdr[0] == LULL_COUNTERS_MAGIC) break;
        memset(hdr, 0, sizeof hdr);
        sleep_ms(5);
    }
    if (hdr[0] != LULL_COUNTERS_MAGIC) {
        close(fd);
        *err = EEXIST;
        lull_message("counter page %s exists and is not a lull counter page (no lull header): "
                     "leaving it alone; no counter page",
                     name);
        return EXISTING_ERROR;
    }
    uint64_t pid = hdr[3], start = hdr[4];
    int locked = page_locked(fd);
    bool stale = locked == 0 && unlocked_page_stale(name_kind_of(name + 1), pid, start);
    close(fd);
    if (!stale) {
        *err = EEXIST;
        lull_message("counter page %s is in use by live process %llu", name,
                     (unsigned long long)pid);
        return EXISTING_LIVE;
    }
    /* Stale: a page of this user whose process is gone. */
    if (shm_unlink(name) != 0 && errno != ENOENT) {
        *err = errno;
        lull_message("cannot remove stale counter page %s: %s", name, err_text(errno));
        return EXISTING_ERROR;
    }
    lull_verbose("removed stale counter page %s", name);
    return EXISTING_GONE;
}

static int build_name(const char *name, pid_t pid) {
    if (!name || !*name) {
        size_t n = sizeof LULL_COUNTERS_NAME_PREFIX - 1;
        memcpy(page_name, LULL_COUNTERS_NAME_PREFIX, n);
        n += lull_format_u64(page_name + n, (uint64_t)pid);
        /* pid 1 of two PID namespaces must not share a name */
        uint64_t ns = own_pidns();
        if (ns && ns != PIDNS_INIT) {
            page_name[n++] = '.';
            lull_format_u64(page_name + n, ns);
        }
        return 0;
    }
    if (*name == '/') name++;
    size_t len = strlen(name);
    if (len == 0 || len > NAME_MAX_LEN || strchr(name, '/') || strcmp(name, ".") == 0 ||
        strcmp(name, "..") == 0) {
        lull_message("counter page name \"%.*s\" is not valid (1-%d characters, no '/')", 64, name,
                     NAME_MAX_LEN);
        return -EINVAL;
    }
    page_name[0] = '/';
    memcpy(page_name + 1, name, len + 1);
    return 0;
}

/* Create the object, exclusively, and lock it before anything else. */
static int create_locked(int *out) {
    int err = 0;
    for (int attempt = 0;; attempt++) {
        int fd;
        if (lull_fault(LULL_FAULT_SHM_OPEN)) {
            fd = -1;
            errno = EACCES;
        } else {
            fd = shm_open(page_name, O_CREAT | O_EXCL | O_RDWR, 0600);
        }
        if (fd >= 0) {
            /* Nobody else can hold a lock on a file just created, unless
             * they opened it in this very moment: then make another one. */
            if (flock(fd, LOCK_EX | LOCK_NB) == 0) {
                *out = fd;
                return 0;
            }
            err = errno;
            close(fd);
            shm_unlink(page_name);
            if (err != EWOULDBLOCK || attempt >= 3) {
                lull_message("cannot create counter page %s: cannot lock it (%s)", page_name,
                             err_text(err));
                return -err;
            }
            continue;
        }
        err = errno;
        if (err != EEXIST || attempt >= 3) {
            lull_message("cannot create counter page %s: %s", page_name, err_text(err));
            return -err;
        }
        if (handle_existing(page_name, &err) != EXISTING_GONE) return -err;
    }
}

static int open_page(const char *name) {
    if (__atomic_load_n(&page, __ATOMIC_SEQ_CST)) return -EBUSY;
    pid_t pid = getpid();
    int err = build_name(name, pid);
    if (err) return err;

    uint64_t start = 0;
    if (stat_start_time("/proc/self/stat", &start) != 0)
        lull_message("cannot read /proc/self/stat: counter page start time unknown");

    int fd = -1;
    err = create_locked(&fd);
    if (err) return err;

    struct lull_counters *p = MAP_FAILED;
    const char *what = "fchmod";
    /* 0600 whatever the umask. */
    if (fchmod(fd, 0600) == 0) {
        what = "ftruncate";
        if (ftruncate(fd, (off_t)PAGE_BYTES) == 0) {
            /* Reserve the page's blocks now: on a full tmpfs ftruncate
             * succeeds, and the first store into the mapping would be a
             * SIGBUS that kills the process. (posix_fallocate returns the
             * error instead of setting errno.) */
            what = "reserving its space (posix_fallocate)";
            int e = posix_fallocate(fd, 0, (off_t)PAGE_BYTES);
            if (e == 0) {
                what = "mmap";
                p = mmap(NULL, PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
            } else {
                errno = e;
            }
        }
    }
    err = errno;
    LULL_RACE_POINT(LULL_RACE_COUNTER_PAGE_OPEN); /* a fork from another thread lands here */
    /* The mapping holds the file, and with it the lock, after this close:
     * until munmap, or until the process exits or execs. */
    close(fd);
    if (p == MAP_FAILED) {
        lull_message("cannot create counter page %s: %s: %s; running without it", page_name, what,
                     err_text(err));
        shm_unlink(page_name); /* created by us, above */
        return -err;
    }
    /* A fork child gets no copy of the mapping: it never holds the parent's
     * lock (a child that outlives its parent would keep a stale page
     * looking alive) and cannot write the parent's page. */
    page_dontfork = madvise(p, PAGE_BYTES, MADV_DONTFORK) == 0;

    long ps = sysconf(_SC_PAGESIZE);
    page_size_cached = ps > 0 ? (uint64_t)ps : 4096;
    /* The object is zero-filled: seq 0, nothing published. Magic last. */
    p->abi_version = LULL_COUNTERS_ABI_VERSION;
    p->size = sizeof(struct lull_counters);
    p->pid = (uint64_t)pid;
    p->start_time = start;
    p->page_size = page_size_cached;
    __atomic_store_n(&p->magic, LULL_COUNTERS_MAGIC, __ATOMIC_RELEASE);

    page_owner = pid;
    page_writer = pthread_self();
    request_served = 0;
    __atomic_store_n(&page, p, __ATOMIC_SEQ_CST);
    lull_verbose("counter page %s", page_name);
    return 0;
}

int counter_page_open(const char *name) {
    __atomic_store_n(&opening, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&ending, __ATOMIC_SEQ_CST)) {
        /* an exec or exit is under way: if the exec fails, try again */
        __atomic_store_n(&reopen_wanted, 1, __ATOMIC_RELAXED);
        __atomic_store_n(&opening, 0, __ATOMIC_SEQ_CST);
        return -ECANCELED;
    }
    pthread_mutex_lock(&open_lock);
    int r = open_page(name);
    pthread_mutex_unlock(&open_lock);
    __atomic_store_n(&opening, 0, __ATOMIC_SEQ_CST);
    return r;
}

void counter_page_fork_prepare(void) {
    pthread_mutex_lock(&open_lock);
}

void counter_page_fork_parent(void) {
    pthread_mutex_unlock(&open_lock);
}

bool counter_page_take_reopen(void) {
    return __atomic_exchange_n(&reopen_wanted, 0, __ATOMIC_RELAXED) != 0;
}

/* --------------------------------------------------------------- sweep */

/* One entry of /dev/shm: remove it if it is a stale page of this user. */
static bool sweep_one(int dir, const char *name, enum name_kind kind) {
    int fd = openat(dir, name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) return false;
    LULL_RACE_POINT(LULL_RACE_COUNTER_PAGE_SWEEP); /* a fork from another thread lands here */
    struct stat st, again;
    uint64_t hdr[5] = {0};
    bool stale = fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid() &&
                 pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr &&
                 hdr[0] == LULL_COUNTERS_MAGIC && page_locked(fd) == 0 &&
                 unlocked_page_stale(kind, hdr[3], hdr[4]);
    /* the name must still be the file judged (it may have been replaced
     * meanwhile, by someone who removed the stale page and made another) */
    bool removed = stale && fstatat(dir, name, &again, AT_SYMLINK_NOFOLLOW) == 0 &&
                   again.st_dev == st.st_dev && again.st_ino == st.st_ino &&
                   unlinkat(dir, name, 0) == 0;
    close(fd);
    if (removed) lull_verbose("removed stale counter page /%s", name);
    return removed;
}

/* Under the open's lock, which fork's prepare handler takes: a child copied
 * inside the sweep kept its descriptors (of /dev/shm, and of the page
 * judged, with the shared lock taken on it) (tests/test_race_counter_page_open.c). */
static int sweep_locked(void);

int counter_page_sweep(void) {
    pthread_mutex_lock(&open_lock);
    int removed = sweep_locked();
    pthread_mutex_unlock(&open_lock);
    return removed;
}

static int sweep_locked(void) {
    int dir = open(LULL_COUNTERS_SHM_DIR, O_RDONLY | O_DIRECTORY | O_NONBLOCK | O_CLOEXEC);
    if (dir < 0) return 0;
    /* getdents64, not readdir: opendir allocates */
    char buf[4096] __attribute__((aligned(8)));
    int entries = 0, pages = 0, removed = 0;
    ssize_t n;
    while (entries < SWEEP_MAX_ENTRIES && (n = getdents64(dir, buf, sizeof buf)) > 0) {
        for (ssize_t off = 0; off < n && entries < SWEEP_MAX_ENTRIES;) {
            struct dirent64 *d = (struct dirent64 *)(buf + off);
            off += d->d_reclen;
            entries++;
            /* default names only: a named page is its configuration's */
            enum name_kind kind = name_kind_of(d->d_name);
            if (kind == NAME_OTHER || (d->d_type != DT_REG && d->d_type != DT_UNKNOWN)) continue;
            if (++pages > SWEEP_MAX_PAGES) goto done;
            removed += sweep_one(dir, d->d_name, kind);
        }
    }
done:
    close(dir);
    return removed;
}

/* ------------------------------------------------------------- publish */

static uint64_t clock_ns(clockid_t id) {
    struct timespec ts;
    if (clock_gettime(id, &ts) != 0) return 0;
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

void counter_page_publish(const struct lull_counters *c) {
    /* Dekker with counter_page_close(): we announce ourselves, then look at
     * the page; close retracts the page, then looks for us. Both seq_cst, so
     * at least one of us sees the other. */
    __atomic_fetch_add(&publishing, 1, __ATOMIC_SEQ_CST);
    struct lull_counters *p = __atomic_load_n(&page, __ATOMIC_SEQ_CST);
    if (p && !pthread_equal(pthread_self(), page_writer)) {
        /* Not the page's writer (the page was opened by another thread,
         * e.g. a test's page in a process whose reclaim thread publishes
         * too): the page is not ours to write. */
        static int warned;
        if (!__atomic_exchange_n(&warned, 1, __ATOMIC_RELAXED))
            lull_verbose("counter page %s: publication from a thread that did not open it "
                         "ignored",
                         page_name);
        p = NULL;
    }
    if (p) {
        lull_counters_word *dst = (lull_counters_word *)p;
        const lull_counters_word *src = (const lull_counters_word *)c;
        const size_t first = offsetof(struct lull_counters, publish_mono_ns) / 8;
        const size_t words = sizeof(struct lull_counters) / 8;
        uint64_t mono = clock_ns(CLOCK_MONOTONIC), real = clock_ns(CLOCK_REALTIME);

        /* seq even -> odd by compare-and-swap: should a second thread ever
         * publish at the same time (there is meant to be one writer), it
         * finds seq odd or loses the swap and skips its publication, instead
         * of interleaving its stores with ours. Acquire orders our stores
         * after those of the previous publication. */
        uint64_t s = __atomic_load_n(&p->seq, __ATOMIC_RELAXED);
        if (!(s & 1) && __atomic_compare_exchange_n(&p->seq, &s, s + 1, false, __ATOMIC_ACQUIRE,
                                                    __ATOMIC_RELAXED)) {
            /* Release stores: a reader whose (acquire) load sees one of
             * them also sees the odd seq stored before it. Not a release
             * fence and relaxed stores: ThreadSanitizer does not model
             * fences, and on x86 both are plain moves anyway. */
            for (size_t i = first; i < words; i++)
                __atomic_store_n(&dst[i], src[i], __ATOMIC_RELEASE);
            __atomic_store_n(&p->publish_mono_ns, mono, __ATOMIC_RELEASE);
            __atomic_store_n(&p->publish_real_ns, real, __ATOMIC_RELEASE);
            if (c->page_size == 0)
                __atomic_store_n(&p->page_size, page_size_cached, __ATOMIC_RELEASE);
            /* Release: the data is visible before the even seq. */
            __atomic_store_n(&p->seq, s + 2, __ATOMIC_RELEASE);
        }
    }
    __atomic_fetch_sub(&publishing, 1, __ATOMIC_RELEASE);
}

/* ------------------------------------------------------------ requests */

/* The page, for the writer alone, with `publishing` raised (close waits
 * for it): NULL if there is none or this is not its writer thread. Every
 * call is followed by request_leave(). */
static struct lull_counters *request_enter(void) {
    __atomic_fetch_add(&publishing, 1, __ATOMIC_SEQ_CST);
    struct lull_counters *p = __atomic_load_n(&page, __ATOMIC_SEQ_CST);
    return p && pthread_equal(pthread_self(), page_writer) ? p : NULL;
}

static void request_leave(void) {
    __atomic_fetch_sub(&publishing, 1, __ATOMIC_RELEASE);
}

bool counter_page_take_request(uint64_t *req) {
    struct lull_counters *p = request_enter();
    bool asked = false;
    if (p) {
        /* Any value but the last one served is a request: nothing else is
         * derived from it (no index, no size, no name). */
        uint64_t r =
            __atomic_load_n(&lull_counters_request_block(p)->profile_request, __ATOMIC_ACQUIRE);
        if (r != request_served) {
            *req = r;
            asked = true;
        }
    }
    request_leave();
    return asked;
}

void counter_page_answer(uint64_t req, int status) {
    struct lull_counters *p = request_enter();
    if (p) {
        volatile struct lull_counters_request *b = lull_counters_request_block(p);
        __atomic_store_n(&b->profile_status, (uint64_t)(status < 0 ? -status : status),
                         __ATOMIC_RELAXED);
        /* Release: the status, and the profile file, before the answer. */
        __atomic_store_n(&b->profile_done, req, __ATOMIC_RELEASE);
        request_served = req;
    }
    request_leave();
}

int counter_page_profile_file(char *buf, size_t len) {
    const char *name = counter_page_name();
    if (!name) return -ENOENT;
    size_t n = strlen(name + 1);
    if (n + sizeof LULL_COUNTERS_PROFILE_SUFFIX > len) return -ENAMETOOLONG;
    memcpy(buf, name + 1, n);
    memcpy(buf + n, LULL_COUNTERS_PROFILE_SUFFIX, sizeof LULL_COUNTERS_PROFILE_SUFFIX);
    return 0;
}

/* The page's profile file goes with the page, when it is a regular file of
 * ours (in /dev/shm, sticky, nobody else can replace it between the look
 * and the unlink); anything else at the name is left alone. */
static void remove_own_profile(void) {
    char
        path[sizeof LULL_COUNTERS_SHM_DIR + sizeof page_name + sizeof LULL_COUNTERS_PROFILE_SUFFIX];
    size_t d = sizeof LULL_COUNTERS_SHM_DIR - 1, n = strlen(page_name);
    if (n == 0) return;
    memcpy(path, LULL_COUNTERS_SHM_DIR, d);
    memcpy(path + d, page_name, n);
    memcpy(path + d + n, LULL_COUNTERS_PROFILE_SUFFIX, sizeof LULL_COUNTERS_PROFILE_SUFFIX);
    struct stat st;
    if (lstat(path, &st) == 0 && S_ISREG(st.st_mode) && st.st_uid == geteuid()) unlink(path);
}

/* --------------------------------------------------------------- close */

LULL_FORK_EXEC_TEXT void counter_page_close(void) {
    struct lull_counters *p = __atomic_exchange_n(&page, NULL, __ATOMIC_SEQ_CST);
    if (!p) return;
    /* A publication that saw the page before we retracted it is still
     * writing: it takes microseconds. Later ones see NULL. */
    while (__atomic_load_n(&publishing, __ATOMIC_SEQ_CST))
        sched_yield();
    bool owner = getpid() == page_owner;
    /* The name goes first, then the mapping (and with it the lock): a
     * sweep never finds our name unlocked while we still run. */
    if (owner && shm_unlink(page_name) != 0 && errno != ENOENT)
        lull_message("cannot remove counter page %s: %s", page_name, err_text(errno));
    if (owner) remove_own_profile();
    /* a fork child that kept the parent's `page` has no such mapping */
    if (owner || !page_dontfork) munmap(p, PAGE_BYTES);
    page_name[0] = '\0';
    page_owner = 0;
}

LULL_FORK_EXEC_TEXT void counter_page_after_fork_child(void) {
    /* Only the forking thread exists here; a publication the parent's
     * reclaim thread was making at fork time is not running in the child,
     * nor an open, nor an exec. */
    lull_mutex_reset_in_child(&open_lock);
    struct lull_counters *p = __atomic_exchange_n(&page, NULL, __ATOMIC_SEQ_CST);
    __atomic_store_n(&publishing, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&opening, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&ending, 0, __ATOMIC_SEQ_CST);
    __atomic_store_n(&reopen_wanted, 0, __ATOMIC_SEQ_CST);
    if (p && !page_dontfork) munmap(p, PAGE_BYTES);
    page_name[0] = '\0';
    page_owner = 0;
    request_served = 0;
    self_pid = getpid();
}

LULL_FORK_EXEC_TEXT const char *counter_page_name(void) {
    return __atomic_load_n(&page, __ATOMIC_SEQ_CST) ? page_name : NULL;
}

const volatile struct lull_counters *counter_page_mapping(void) {
    return __atomic_load_n(&page, __ATOMIC_SEQ_CST);
}

/* ------------------------------------------------- the process's ends */

/* On the way out (any thread): no page may be created from now on, and one
 * being created is waited for. false in a process that is not ours (a
 * vfork child: the memory is the parent's). */
LULL_FORK_EXEC_TEXT static bool gate_enter(void) {
    if (!self_pid || getpid() != self_pid) return false;
    __atomic_fetch_add(&ending, 1, __ATOMIC_SEQ_CST);
    /* An open takes microseconds, with a stale page's check up to 0.1 s.
     * One stuck (its message blocked on a full stderr pipe) must not hold
     * the exit: after a second the page, if any, is left to the sweeps.
     * Cancellation off while we sleep (only now: in a vfork child, which
     * the pid check sent back, the state would be the parent thread's): a
     * thread with a cancel pending was cancelled in the nanosleep, inside
     * exit, _exit or exec, `ending` raised for good
     * (tests/test_race_exit_cancel.c). */
    int cancel = lull_cancel_off();
    for (int i = 0; i < 1000 && __atomic_load_n(&opening, __ATOMIC_SEQ_CST); i++)
        sleep_ms(1);
    lull_cancel_restore(cancel);
    return true;
}

LULL_FORK_EXEC_TEXT void counter_page_at_exit(void) {
    if (gate_enter()) counter_page_close();
}

#ifdef LULL_OVERRIDE
/* _exit and the exec family, wrapped (a program calls them through the
 * dynamic linker; lull comes first, as for malloc): the name of the page
 * goes before the process does. exit() is the atexit handler's, and
 * quick_exit at_quick_exit's. What lull cannot see keeps its page until the
 * next lull process of the user, or lullstat --clean, finds it stale: a raw
 * exit_group or execve system call, a signal that kills, a crash. */

typedef int (*execve_fn)(const char *, char *const[], char *const[]);
typedef int (*execv_fn)(const char *, char *const[]);
typedef int (*execveat_fn)(int, const char *, char *const[], char *const[], int);
typedef int (*fexecve_fn)(int, char *const[], char *const[]);
typedef void (*exit_fn)(int);

/* The C library's, resolved at start (dlsym may allocate: never on the way
 * out, never in a vfork child). */
static struct {
    execve_fn execve, execvpe;
    execv_fn execv, execvp;
    execveat_fn execveat;
    fexecve_fn fexecve;
    exit_fn exit_, Exit;
} real LULL_FORK_EXEC_DATA;

static void resolve_real(void) {
    real.execve = (execve_fn)dlsym(RTLD_NEXT, "execve");
    real.execvpe = (execve_fn)dlsym(RTLD_NEXT, "execvpe");
    real.execv = (execv_fn)dlsym(RTLD_NEXT, "execv");
    real.execvp = (execv_fn)dlsym(RTLD_NEXT, "execvp");
    real.execveat = (execveat_fn)dlsym(RTLD_NEXT, "execveat");
    real.fexecve = (fexecve_fn)dlsym(RTLD_NEXT, "fexecve");
    real.exit_ = (exit_fn)dlsym(RTLD_NEXT, "_exit");
    real.Exit = (exit_fn)dlsym(RTLD_NEXT, "_Exit");
}

/* Before an exec: the page goes (gate, close). Returns what exec_failed()
 * needs to undo: 0 nothing, 1 the gate, 2 the gate and a page to reopen. */
LULL_FORK_EXEC_TEXT static int exec_begin(void) {
    if (!gate_enter()) return 0;
    bool had = counter_page_name() != NULL;
    counter_page_close();
    return had ? 2 : 1;
}

/* The exec returned: it failed, and the process runs on as it was. */
LULL_FORK_EXEC_TEXT static void exec_failed(int how) {
    if (!how) return;
    int e = errno;
    if (how == 2) __atomic_store_n(&reopen_wanted, 1, __ATOMIC_RELAXED);
    __atomic_fetch_sub(&ending, 1, __ATOMIC_SEQ_CST);
    errno = e;
}

LULL_FORK_EXEC_TEXT static void exit_begin(void) {
    if (!gate_enter()) return;
    /* the name only: other threads may still publish into the mapping,
     * and the kernel unmaps it in a moment */
    if (__atomic_load_n(&page, __ATOMIC_SEQ_CST) && getpid() == page_owner) {
        shm_unlink(page_name);
        remove_own_profile();
    }
}

LULL_EXPORT LULL_FORK_EXEC_TEXT void _exit(int status) {
    exit_begin();
    if (real.exit_) real.exit_(status);
    for (;;)
        syscall(SYS_exit_group, status);
}

LULL_EXPORT LULL_FORK_EXEC_TEXT void _Exit(int status) {
    exit_begin();
    if (real.Exit) real.Exit(status);
    for (;;)
        syscall(SYS_exit_group, status);
}

extern char **environ;

/* The C library's execve, or the system call before lull has looked it up. */
LULL_FORK_EXEC_TEXT static int execve_unwrapped(const char *path, char *const argv[],
                                                char *const envp[]) {
    return real.execve ? real.execve(path, argv, envp) : (int)syscall(SYS_execve, path, argv, envp);
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execve(const char *path, char *const argv[],
                                           char *const envp[]) {
    int how = exec_begin();
    int r = execve_unwrapped(path, argv, envp);
    exec_failed(how);
    return r;
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execveat(int dirfd, const char *path, char *const argv[],
                                             char *const envp[], int flags) {
    int how = exec_begin();
    int r = real.execveat ? real.execveat(dirfd, path, argv, envp, flags)
                          : (int)syscall(SYS_execveat, dirfd, path, argv, envp, flags);
    exec_failed(how);
    return r;
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int fexecve(int fd, char *const argv[], char *const envp[]) {
    int how = exec_begin();
    int r = real.fexecve ? real.fexecve(fd, argv, envp)
                         : (int)syscall(SYS_execveat, fd, "", argv, envp, AT_EMPTY_PATH);
    exec_failed(how);
    return r;
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execv(const char *path, char *const argv[]) {
    int how = exec_begin();
    int r = real.execv ? real.execv(path, argv) : execve_unwrapped(path, argv, environ);
    exec_failed(how);
    return r;
}

/* The PATH searches: the C library's, or, in a process that execs before
 * lull has started (its first allocation, when resolve_real runs), the
 * same search done here (base/exec_search.h). They failed with ENOSYS
 * there before: /usr/bin/time under the preload could run nothing. */
LULL_EXPORT LULL_FORK_EXEC_TEXT int execvp(const char *file, char *const argv[]) {
    int how = exec_begin();
    int r = real.execvp ? real.execvp(file, argv)
                        : lull_exec_search(file, argv, environ, execve_unwrapped);
    exec_failed(how);
    return r;
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execvpe(const char *file, char *const argv[],
                                            char *const envp[]) {
    int how = exec_begin();
    int r = real.execvpe ? real.execvpe(file, argv, envp)
                         : lull_exec_search(file, argv, envp, execve_unwrapped);
    exec_failed(how);
    return r;
}

/* The list forms build the vector on the stack, as the C library's do
 * (arg is not NULL: the headers say so): argv, declared in the caller's
 * scope, gets arg and the list after it up to its NULL; ap is left at that
 * NULL. A macro: the array lives in the caller's frame. */
#define ARGV_FROM_LIST(argv, arg, ap)                                                              \
    size_t argv##_n = 1;                                                                           \
    do {                                                                                           \
        va_list cp_;                                                                               \
        va_copy(cp_, ap);                                                                          \
        while (va_arg(cp_, char *))                                                                \
            argv##_n++;                                                                            \
        va_end(cp_);                                                                               \
    } while (0);                                                                                   \
    char *argv[argv##_n + 1];                                                                      \
    argv[0] = (char *)(arg);                                                                       \
    for (size_t i_ = 1; i_ < argv##_n; i_++)                                                       \
        argv[i_] = va_arg(ap, char *);                                                             \
    argv[argv##_n] = NULL

LULL_EXPORT LULL_FORK_EXEC_TEXT int execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    ARGV_FROM_LIST(argv, arg, ap);
    va_end(ap);
    return execv(path, argv);
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    ARGV_FROM_LIST(argv, arg, ap);
    va_end(ap);
    return execvp(file, argv);
}

LULL_EXPORT LULL_FORK_EXEC_TEXT int execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    ARGV_FROM_LIST(argv, arg, ap);
    (void)va_arg(ap, char *); /* the NULL that ends the list */
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, argv, envp);
}
#endif

void counter_page_process_start(void) {
    self_pid = getpid();
#ifdef LULL_OVERRIDE
    resolve_real();
#endif
}

#ifdef __GLIBC__
/* at_quick_exit is a stub of libc_nonshared.a, linked at the end of lull's
 * text (src/init.c says why its atexit and atfork are called this way) */
extern void *__dso_handle __attribute__((weak, visibility("hidden")));
int __cxa_at_quick_exit(void (*fn)(void *), void *dso);

LULL_FORK_EXEC_TEXT static void quick_exit_handler(void *unused) {
    (void)unused;
    counter_page_at_exit();
}

LULL_FORK_EXEC_TEXT void counter_page_register_exit(void) {
    __cxa_at_quick_exit(quick_exit_handler, __dso_handle);
}
#else
void counter_page_register_exit(void) {
    at_quick_exit(counter_page_at_exit);
}
#endif
