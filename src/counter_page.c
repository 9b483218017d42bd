/* The counter page writer; see counter_page.h and include/lull/counters.h.
 * lull is the allocator: nothing here may allocate (no malloc, no stdio).
 * The page is reached with shm_open/ftruncate/mmap, and /proc is read with
 * open/read into stack buffers. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include "src/counter_page.h"
#include "src/fault.h"
#include "src/message.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define NAME_MAX_LEN 200

/* The mapping, published with seq_cst so that close and publish agree on
 * who may touch it (see counter_page_close). */
static struct lull_counters *page;
/* Number of counter_page_publish() calls that may be using `page`. */
static int publishing;
static char page_name[NAME_MAX_LEN + 2];
static pid_t page_owner;
/* The thread that opened the page: its only writer. */
static pthread_t page_writer;
static uint64_t page_size_cached;

/* Decimal digits of v into buf (NUL-terminated); returns the length. */
static size_t format_u64(char *buf, uint64_t v) {
    char tmp[24];
    size_t n = 0;
    do {
        tmp[n++] = (char)('0' + v % 10);
        v /= 10;
    } while (v);
    for (size_t i = 0; i < n; i++)
        buf[i] = tmp[n - 1 - i];
    buf[n] = '\0';
    return n;
}

/* Start time (field 22 of /proc/<pid>/stat, clock ticks after boot) of a
 * running process. Returns 0, -ESRCH if there is no such process or it is a
 * zombie (it will never publish again), or -EIO if the file is unreadable. */
static int proc_start_time(uint64_t pid, uint64_t *out) {
    char path[48] = "/proc/";
    size_t n = strlen(path);
    n += format_u64(path + n, pid);
    memcpy(path + n, "/stat", sizeof "/stat");

    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? -ESRCH : -EIO;
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
    close(fd);

    if (hdr[0] != LULL_COUNTERS_MAGIC) {
        *err = EEXIST;
        lull_message("counter page %s exists and is not a lull counter page (no lull header): "
                     "leaving it alone; no counter page",
                     name);
        return EXISTING_ERROR;
    }
    uint64_t pid = hdr[3], start = hdr[4], now;
    /* our own pid: the page of this process before an exec (exec keeps the
     * pid and start time but runs no exit handler), so it is ours to
     * replace */
    if (pid != (uint64_t)getpid() && proc_start_time(pid, &now) == 0 && now == start) {
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
        format_u64(page_name + n, (uint64_t)pid);
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

int counter_page_open(const char *name) {
    if (__atomic_load_n(&page, __ATOMIC_SEQ_CST)) return -EBUSY;
    pid_t pid = getpid();
    int err = build_name(name, pid);
    if (err) return err;

    uint64_t start = 0;
    if (proc_start_time((uint64_t)pid, &start) != 0)
        lull_message("cannot read /proc/%d/stat: counter page start time unknown", (int)pid);

    int fd = -1;
    for (int attempt = 0; fd < 0; attempt++) {
        if (lull_fault(LULL_FAULT_SHM_OPEN)) {
            fd = -1;
            errno = EACCES;
        } else {
            fd = shm_open(page_name, O_CREAT | O_EXCL | O_RDWR, 0600);
        }
        if (fd >= 0) break;
        err = errno;
        if (err != EEXIST || attempt >= 3) {
            lull_message("cannot create counter page %s: %s", page_name, err_text(err));
            return -err;
        }
        if (handle_existing(page_name, &err) != EXISTING_GONE) return -err;
    }

    struct lull_counters *p = MAP_FAILED;
    const char *what = "fchmod";
    /* 0600 whatever the umask. */
    if (fchmod(fd, 0600) == 0) {
        what = "ftruncate";
        if (ftruncate(fd, (off_t)sizeof(struct lull_counters)) == 0) {
            /* Reserve the page's blocks now: on a full tmpfs ftruncate
             * succeeds, and the first store into the mapping would be a
             * SIGBUS that kills the process. (posix_fallocate returns the
             * error instead of setting errno.) */
            what = "reserving its space (posix_fallocate)";
            int e = posix_fallocate(fd, 0, (off_t)sizeof(struct lull_counters));
            if (e == 0) {
                what = "mmap";
                p = mmap(NULL, sizeof(struct lull_counters), PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                         0);
            } else {
                errno = e;
            }
        }
    }
    err = errno;
    close(fd);
    if (p == MAP_FAILED) {
        lull_message("cannot create counter page %s: %s: %s; running without it", page_name, what,
                     err_text(err));
        shm_unlink(page_name); /* created by us, above */
        return -err;
    }

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
    __atomic_store_n(&page, p, __ATOMIC_SEQ_CST);
    lull_verbose("counter page %s", page_name);
    return 0;
}

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

void counter_page_close(void) {
    struct lull_counters *p = __atomic_exchange_n(&page, NULL, __ATOMIC_SEQ_CST);
    if (!p) return;
    /* A publication that saw the page before we retracted it is still
     * writing: it takes microseconds. Later ones see NULL. */
    while (__atomic_load_n(&publishing, __ATOMIC_SEQ_CST))
        sched_yield();
    munmap(p, sizeof(struct lull_counters));
    if (getpid() == page_owner && shm_unlink(page_name) != 0 && errno != ENOENT)
        lull_message("cannot remove counter page %s: %s", page_name, err_text(errno));
    page_name[0] = '\0';
    page_owner = 0;
}

void counter_page_after_fork_child(void) {
    /* Only the forking thread exists here; a publication the parent's
     * reclaim thread was making at fork time is not running in the child. */
    struct lull_counters *p = __atomic_exchange_n(&page, NULL, __ATOMIC_SEQ_CST);
    __atomic_store_n(&publishing, 0, __ATOMIC_SEQ_CST);
    if (p) munmap(p, sizeof(struct lull_counters));
    page_name[0] = '\0';
    page_owner = 0;
}

const char *counter_page_name(void) {
    return __atomic_load_n(&page, __ATOMIC_SEQ_CST) ? page_name : NULL;
}

const volatile struct lull_counters *counter_page_mapping(void) {
    return __atomic_load_n(&page, __ATOMIC_SEQ_CST);
}
