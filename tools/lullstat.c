/* lullstat: print the counter page of a process running lull.
 *
 * Built against include/lull/counters.h only (the ABI), never the library:
 * it reads pages of any lull of the same ABI version.
 *
 * PID is a pid as this lullstat's /proc shows it (normally its own PID
 * namespace's view). A process in another PID namespace names its page
 * lull.<its own pid>.<namespace inode>: lullstat finds that name from
 * /proc/PID (the NSpid line of status, ns/pid), and prints PID.
 *
 *   lullstat PID                 the page of PID, once
 *   lullstat -i MS [-n N] PID    one line every MS ms (vmstat style)
 *   lullstat --json PID          JSON (one object per line with -i)
 *   lullstat --prom PID          Prometheus text exposition format
 *   lullstat --name NAME         a page by its shm name instead of a pid
 *   lullstat --list              lull pages on this machine, alive or stale
 *   lullstat --clean [PID|NAME]  remove stale pages (of dead processes)
 *   lullstat --heap-profile [-t S] PID FILE
 *                                ask PID for a heap profile (gzip pprof)
 *                                through its page's request block, and put
 *                                it at FILE
 *
 * Pages, process names and file names in /dev/shm come from other users'
 * programs: a FIFO or other non-file at a page's name is "not a counter
 * page" (opened O_NONBLOCK, it never blocks), a page truncated while it is
 * read is an error (not a SIGBUS), and text from a page or a process is
 * printed with its control characters escaped (\xNN).
 */
#define _GNU_SOURCE
#include <lull/counters.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pwd.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* Exit codes (also in --help). */
enum {
    EX_OK = 0,
    EX_FAIL = 1,         /* anything else (I/O error, ...) */
    EX_USAGE = 2,        /* bad command line */
    EX_NOPROC = 3,       /* no such process (or it exited during -i) */
    EX_NOPAGE = 4,       /* the process has no counter page */
    EX_VERSION = 5,      /* unknown ABI version, or not a counter page */
    EX_PERM = 6,         /* permission denied (another user's page) */
    EX_TORN = 7,         /* no consistent snapshot: the writer is stuck mid-publication */
    EX_STALE = 8,        /* the page named after PID belongs to an earlier, dead process */
    EX_TIMEOUT = 9,      /* --heap-profile: no answer within the timeout */
    EX_PROFILE_OFF = 10, /* --heap-profile: heap profiling is off in the process */
};

static const char *prog = "lullstat";

static void err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void err(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "%s: ", prog);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
}

/* ------------------------------------------------------------ processes */

/* Start time (field 22 of /proc/PID/stat) of a running process: 0, or
 * -ESRCH (no such process, or a zombie), -EIO. */
static int proc_start_time(uint64_t pid, uint64_t *out) {
    char path[64], buf[1024];
    snprintf(path, sizeof path, "/proc/%" PRIu64 "/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno == ENOENT ? -ESRCH : -EIO;
    ssize_t len = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (len <= 0) return len == 0 ? -ESRCH : -EIO;
    buf[len] = '\0';
    char *p = strrchr(buf, ')');
    if (!p || p[1] != ' ') return -EIO;
    p += 2;
    if (*p == 'Z' || *p == 'X' || *p == 'x') return -ESRCH;
    for (int field = 3; field < 22; field++) {
        p = strchr(p, ' ');
        if (!p) return -EIO;
        p++;
    }
    char *end;
    errno = 0;
    unsigned long long v = strtoull(p, &end, 10);
    if (end == p || errno) return -EIO;
    *out = v;
    return 0;
}

/* Does /proc/PID run as uid (its real, effective, saved or file system
 * uid)? 1 yes, 0 no, -1 cannot tell. */
static int proc_has_uid(uint64_t pid, uid_t uid) {
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%" PRIu64 "/status", pid);
    FILE *f = fopen(path, "re");
    if (!f) return -1;
    int r = -1;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "Uid:", 4) != 0) continue;
        char *p = line + 4, *end;
        for (int i = 0; i < 4; i++) {
            errno = 0;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p || errno) break;
            if (r < 0) r = 0;
            if (v == (unsigned long long)uid) r = 1;
            p = end;
        }
        break;
    }
    fclose(f);
    return r;
}

/* Is the writer of a page with this (pid, start_time) still running, as
 * /proc shows pids? */
static bool writer_alive(uint64_t pid, uint64_t start_time) {
    uint64_t now;
    if (pid == 0 || pid > INT_MAX) return false;
    if (proc_start_time(pid, &now) != 0) return false;
    return start_time == 0 || now == start_time; /* 0: the writer could not read its own */
}

/* ------------------------------------------------------ PID namespaces */

/* The inode of the initial PID namespace (PROC_PID_INIT_INO): its
 * processes' pages keep the plain name lull.<pid>. */
#define PIDNS_INIT UINT64_C(0xEFFFFFFC)

/* The PID namespace of /proc/WHO ("self" or a pid): its inode, 0 if it
 * cannot be read (no such process, or not ours to inspect). */
static uint64_t pidns_of(const char *who) {
    char path[NAME_MAX + 32];
    struct stat st;
    snprintf(path, sizeof path, "/proc/%s/ns/pid", who);
    return stat(path, &st) == 0 ? (uint64_t)st.st_ino : 0;
}

static uint64_t own_pidns(void) {
    static uint64_t ns = 1;
    if (ns == 1) ns = pidns_of("self");
    return ns;
}

/* The pid of /proc/PID in its own PID namespace: the last number of the
 * NSpid line of its status (PID itself on kernels without the line). */
static bool proc_ns_pid(uint64_t pid, uint64_t *out) {
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%" PRIu64 "/status", pid);
    FILE *f = fopen(path, "re");
    if (!f) return false;
    *out = pid;
    while (fgets(line, sizeof line, f)) {
        if (strncmp(line, "NSpid:", 6) != 0) continue;
        char *p = line + 6, *end;
        for (;;) {
            errno = 0;
            unsigned long long v = strtoull(p, &end, 10);
            if (end == p || errno) break;
            *out = v;
            p = end;
        }
        break;
    }
    fclose(f);
    return true;
}

/* The default page name of the process /proc/PID ("/lull.1234", or
 * "/lull.1.4026532178" in another PID namespace), and its pid there. */
static void default_page_name(uint64_t pid, char *buf, size_t len, uint64_t *ns_pid) {
    char who[24];
    snprintf(who, sizeof who, "%" PRIu64, pid);
    uint64_t ns = pidns_of(who);
    *ns_pid = pid;
    if (ns && ns != PIDNS_INIT && proc_ns_pid(pid, ns_pid))
        snprintf(buf, len, "%s%" PRIu64 ".%" PRIu64, LULL_COUNTERS_NAME_PREFIX, *ns_pid, ns);
    else
        snprintf(buf, len, "%s%" PRIu64, LULL_COUNTERS_NAME_PREFIX, pid);
}

/* What a page's name says (name without the leading '/'): lull.<pid> a
 * page of the initial PID namespace (or of a lull that did not name
 * namespaces), lull.<pid>.<ns> one of PID namespace ns (*ns), written by a
 * lull that locks its page; anything else a name given by counter_page=. */
enum name_kind { NAME_PLAIN, NAME_PIDNS, NAME_OTHER };

static bool all_digits(const char *s, size_t n) {
    if (n == 0 || n > 20) return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9') return false;
    return true;
}

static enum name_kind name_kind_of(const char *name, uint64_t *ns) {
    *ns = 0;
    if (name[0] == '/') name++;
    if (strncmp(name, "lull.", 5) != 0) return NAME_OTHER;
    const char *p = name + 5, *dot = strchr(p, '.');
    if (!dot) return all_digits(p, strlen(p)) ? NAME_PLAIN : NAME_OTHER;
    if (!all_digits(p, (size_t)(dot - p)) || !all_digits(dot + 1, strlen(dot + 1)))
        return NAME_OTHER;
    *ns = strtoull(dot + 1, NULL, 10);
    return NAME_PIDNS;
}

/* The pid, as /proc shows it, of the process that is pid ns_pid in PID
 * namespace ns; 0 if none is visible. One walk of /proc, kept. */
static uint64_t view_pid_of(uint64_t ns, uint64_t ns_pid) {
    static struct { uint64_t ns, ns_pid, pid; } * procs;
    static size_t count;
    static bool walked;
    if (!walked) {
        walked = true;
        size_t cap = 0;
        DIR *d = opendir("/proc");
        for (struct dirent *de; d && (de = readdir(d));) {
            uint64_t pid, pns, npid;
            char *end;
            pid = strtoull(de->d_name, &end, 10);
            if (*end || end == de->d_name) continue;
            pns = pidns_of(de->d_name);
            if (!pns || pns == PIDNS_INIT || !proc_ns_pid(pid, &npid)) continue;
            if (count == cap) {
                cap = cap ? cap * 2 : 64;
                void *n = realloc(procs, cap * sizeof *procs);
                if (!n) break;
                procs = n;
            }
            procs[count].ns = pns;
            procs[count].ns_pid = npid;
            procs[count++].pid = pid;
        }
        if (d) closedir(d);
    }
    for (size_t i = 0; i < count; i++)
        if (procs[i].ns == ns && procs[i].ns_pid == ns_pid) return procs[i].pid;
    return 0;
}

/* ------------------------------------------------------------- liveness */

/* Every lull that writes a page holds an exclusive flock on it (through
 * its mapping) from before the header is written until its process exits,
 * execs or is killed, when the kernel drops it, in any PID namespace. 1 the
 * page is locked, 0 not, -1 cannot tell. */
static int page_locked(int fd) {
    if (flock(fd, LOCK_SH | LOCK_NB) == 0) {
        flock(fd, LOCK_UN);
        return 0;
    }
    return errno == EWOULDBLOCK ? 1 : -1;
}

enum writer { WRITER_ALIVE, WRITER_GONE, WRITER_UNKNOWN };

/* The writer of a page: alive if the page is locked. An unlocked page
 * named for a PID namespace is stale (lull locks every such page). Other
 * unlocked pages may be an older lull's, which did not lock: judged by the
 * header's (pid, start time) as /proc shows pids, which is meaningful for a
 * plain name only in the initial PID namespace. (The rule lull itself
 * applies, src/counter_page.c.) */
static enum writer writer_of(int locked, enum name_kind kind, uint64_t pid, uint64_t start) {
    if (locked == 1) return WRITER_ALIVE;
    if (locked < 0) return WRITER_UNKNOWN;
    if (kind == NAME_PIDNS) return WRITER_GONE;
    if (kind == NAME_PLAIN && own_pidns() != PIDNS_INIT) return WRITER_UNKNOWN;
    if (access("/proc/self/stat", R_OK) != 0) return WRITER_UNKNOWN; /* no /proc to judge by */
    return writer_alive(pid, start) ? WRITER_ALIVE : WRITER_GONE;
}

/* s for a terminal, into buf: printable ASCII as it is, a backslash as
 * \\, every other byte (control characters, DEL, bytes of other encodings)
 * as \xNN. Page names, process names and a page's config string come from
 * other users' programs: printed raw, an escape sequence in them would drive
 * the reader's terminal. A buffer of 4 x strlen(s) + 1 bytes holds it all. */
static const char *escape(char *buf, size_t len, const char *s) {
    size_t n = 0;
    for (; *s && n + 5 <= len; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '\\') {
            buf[n++] = '\\';
            buf[n++] = '\\';
        } else if (ch >= 0x20 && ch < 0x7f) {
            buf[n++] = (char)ch;
        } else {
            n += (size_t)snprintf(buf + n, len - n, "\\x%02x", ch);
        }
    }
    buf[n < len ? n : len - 1] = '\0';
    return buf;
}

#define ESCAPED_LEN(raw) (4 * (raw) + 1)

/* The process's name (/proc/PID/comm, which it sets itself), escaped. */
static void proc_comm(uint64_t pid, char *buf, size_t len) {
    char path[64], raw[64] = "-";
    snprintf(path, sizeof path, "/proc/%" PRIu64 "/comm", pid);
    FILE *f = fopen(path, "re");
    if (f) {
        if (fgets(raw, (int)sizeof raw, f)) raw[strcspn(raw, "\n")] = '\0';
        fclose(f);
    }
    escape(buf, len, raw);
}

/* ---------------------------------------------------------------- pages */

struct page {
    char name[256];               /* shm name, "/lull.1234" */
    char shown[ESCAPED_LEN(256)]; /* the name as printed (escaped) */
    const volatile struct lull_counters *map;
    size_t len;
    int fd;                   /* kept open: its lock tells whether the writer lives */
    enum name_kind kind;      /* what the name says */
    uint64_t ns;              /* the PID namespace the name gives (NAME_PIDNS) */
    uint64_t pid, start_time; /* the header's, read when the page was opened */
    uint64_t view_pid;        /* the writer's pid as /proc shows it; 0 unknown */
    uid_t uid;                /* the file's owner */
};

/* A page is a file anyone with write access can truncate while it is
 * mapped here (its writer's successor, another tool, an attacker of the
 * same user): a read of the mapping past the new end raises SIGBUS. Every
 * read of a mapping runs with bus_armed set, after a sigsetjmp(bus_env): a
 * SIGBUS there returns from that sigsetjmp a second time, with 1. */
static sigjmp_buf bus_env;
static volatile sig_atomic_t bus_armed;

static void on_sigbus(int sig) {
    if (bus_armed) siglongjmp(bus_env, 1);
    signal(sig, SIG_DFL); /* not a page read: the default, a crash */
    raise(sig);
}

static void bus_handler_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigbus;
    sigaction(SIGBUS, &sa, NULL);
}

static int page_truncated(const struct page *pg) {
    err("%s was truncated while lullstat read it: it is no longer a whole counter page (someone "
        "who can write it shrank it)",
        pg->shown);
    return EX_FAIL;
}

static void page_unmap(struct page *pg) {
    if (pg->map) munmap((void *)pg->map, pg->len);
    pg->map = NULL;
    if (pg->fd >= 0) close(pg->fd);
    pg->fd = -1;
}

static enum writer page_writer(const struct page *pg) {
    return writer_of(page_locked(pg->fd), pg->kind, pg->pid, pg->start_time);
}

static int header_ok(const struct page *pg, uint64_t magic, uint64_t version, uint64_t size,
                     size_t file_size) {
    if (magic != LULL_COUNTERS_MAGIC) {
        err("%s is not a lull counter page (bad magic 0x%016" PRIx64 ")", pg->shown, magic);
        return EX_VERSION;
    }
    if (version != LULL_COUNTERS_ABI_VERSION) {
        err("%s has counter page ABI version %" PRIu64 "; this lullstat knows version %d",
            pg->shown, version, LULL_COUNTERS_ABI_VERSION);
        return EX_VERSION;
    }
    if (size < sizeof(struct lull_counters) || file_size < sizeof(struct lull_counters)) {
        err("%s (ABI version %" PRIu64 ") is %" PRIu64 " bytes (file %zu); this lullstat needs %zu",
            pg->shown, version, size, file_size, sizeof(struct lull_counters));
        return EX_VERSION;
    }
    return EX_OK;
}

static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISSOCK(mode)) return "a socket";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISDIR(mode)) return "a directory";
    return "not a regular file";
}

/* Map the page `name` read-only and check its header. */
static int page_open(struct page *pg, const char *name) {
    memset(pg, 0, sizeof *pg);
    pg->fd = -1;
    snprintf(pg->name, sizeof pg->name, "%s%s", name[0] == '/' ? "" : "/", name);
    escape(pg->shown, sizeof pg->shown, pg->name);
    pg->kind = name_kind_of(pg->name, &pg->ns);
    /* O_NONBLOCK: a FIFO at the name (anyone can make one at the
     * predictable lull.PID) must not block the open; O_NOFOLLOW: nor may a
     * symbolic link lead elsewhere */
    int fd = shm_open(pg->name, O_RDONLY | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT) return EX_NOPAGE;
        if (e == EACCES || e == EPERM) {
            err("%s: permission denied (the page is readable by its owner only: run lullstat as "
                "the same user as the process, or as root)",
                pg->shown);
            return EX_PERM;
        }
        if (e == ELOOP) {
            err("%s is not a lull counter page (a symbolic link)", pg->shown);
            return EX_VERSION;
        }
        err("%s: %s", pg->shown, strerror(e));
        return EX_FAIL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        err("%s: %s", pg->shown, strerror(errno));
        close(fd);
        return EX_FAIL;
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        err("%s is not a lull counter page (%s)", pg->shown, file_kind(st.st_mode));
        return EX_VERSION;
    }
    pg->uid = st.st_uid;
    size_t fsize = (size_t)st.st_size;
    if (fsize < offsetof(struct lull_counters, seq) + 8) {
        close(fd);
        err("%s is not a lull counter page (%zu bytes)", pg->shown, fsize);
        return EX_VERSION;
    }
    pg->len = fsize < sizeof(struct lull_counters) ? fsize : sizeof(struct lull_counters);
    void *m = mmap(NULL, pg->len, PROT_READ, MAP_SHARED, fd, 0);
    int e = errno;
    if (m == MAP_FAILED) {
        close(fd);
        err("%s: mmap: %s", pg->shown, strerror(e));
        return EX_FAIL;
    }
    pg->map = m;
    pg->fd = fd;
    if (sigsetjmp(bus_env, 1)) {
        bus_armed = 0;
        page_unmap(pg);
        return page_truncated(pg);
    }
    bus_armed = 1;
    /* magic is stored last when the page is created: give a writer that is
     * just starting a moment. */
    uint64_t magic = 0;
    for (int i = 0; i < 50; i++) {
        magic = __atomic_load_n(&pg->map->magic, __ATOMIC_ACQUIRE);
        if (magic != 0) break;
        struct timespec ts = {0, 2000000};
        nanosleep(&ts, NULL);
    }
    uint64_t version = pg->map->abi_version, size = pg->map->size;
    pg->pid = pg->map->pid;
    pg->start_time = pg->map->start_time;
    bus_armed = 0;
    /* a page of another PID namespace: its writer's pid as we see it */
    pg->view_pid = pg->kind == NAME_PIDNS ? view_pid_of(pg->ns, pg->pid) : pg->pid;
    int rc = header_ok(pg, magic, version, size, fsize);
    if (rc != EX_OK) page_unmap(pg);
    return rc;
}

/* A consistent copy; retries for about a second. */
static int page_snapshot(const struct page *pg, struct lull_counters *out) {
    if (sigsetjmp(bus_env, 1)) {
        bus_armed = 0;
        return page_truncated(pg);
    }
    bus_armed = 1;
    for (int i = 0; i < 1000; i++) {
        if (lull_counters_snapshot(pg->map, out) == 0) {
            bus_armed = 0;
            /* a page cut inside its last page of memory raises no SIGBUS:
             * the copy read zeros past the cut, which would print as
             * figures. The size says it (after the copy: a cut during it
             * is seen too) */
            struct stat st;
            if (fstat(pg->fd, &st) != 0 || (size_t)st.st_size < pg->len) return page_truncated(pg);
            out->config[sizeof out->config - 1] = '\0';
            return EX_OK;
        }
        struct timespec ts = {0, 1000000};
        nanosleep(&ts, NULL);
    }
    uint64_t seq = pg->map->seq;
    bus_armed = 0;
    err("%s: no consistent snapshot after 1 s of retries (seq stays odd at %" PRIu64
        "): the writer is stuck or died while publishing",
        pg->shown, seq);
    return EX_TORN;
}

/* ----------------------------------------------------------- formatting */

static uint64_t now_ns(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* "1.5 MiB" (long) or "1.5M" (compact). */
static const char *human(char *buf, size_t len, double v, bool compact) {
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    int u = 0;
    while (v >= 1024 && u < 6) {
        v /= 1024;
        u++;
    }
    if (compact) {
        if (u == 0)
            snprintf(buf, len, "%.0f", v);
        else
            snprintf(buf, len, v < 10 ? "%.1f%c" : "%.0f%c", v, units[u][0]);
    } else {
        snprintf(buf, len, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
    }
    return buf;
}

/* Count with k/M/G suffix for the interval columns. */
static const char *count_compact(char *buf, size_t len, double v) {
    static const char suffix[] = " kMGTPE";
    int u = 0;
    while (v >= 10000 && u < 6) {
        v /= 1000;
        u++;
    }
    if (u == 0)
        snprintf(buf, len, "%.0f", v);
    else
        snprintf(buf, len, "%.0f%c", v, suffix[u]);
    return buf;
}

static const char *node_label(char *buf, size_t len, uint64_t id) {
    if (id == LULL_COUNTERS_NODE_OTHER)
        snprintf(buf, len, "other");
    else
        snprintf(buf, len, "%" PRIu64, id);
    return buf;
}

static uint64_t node_count(const struct lull_counters *c) {
    return c->node_count < LULL_COUNTERS_MAX_NODES ? c->node_count : LULL_COUNTERS_MAX_NODES;
}

/* The huge-mapping cache's counters, summed over the nodes. */
typedef struct {
    uint64_t hits, misses, bytes;
} huge_cache_sum;

static huge_cache_sum huge_cache_of(const struct lull_counters *c) {
    huge_cache_sum s = {0, 0, 0};
    for (uint64_t i = 0; i < node_count(c); i++) {
        s.hits += c->nodes[i].huge_cache_hits;
        s.misses += c->nodes[i].huge_cache_misses;
        s.bytes += c->nodes[i].huge_cache_bytes;
    }
    return s;
}

static bool identity_ok(const struct lull_counters_accounting *a) {
    return lull_counters_accounting_sum(a) == a->mapped;
}

/* Does every node and the total satisfy the identity? */
static bool all_identities_ok(const struct lull_counters *c) {
    if (!identity_ok(&c->total)) return false;
    for (uint64_t i = 0; i < node_count(c); i++)
        if (!identity_ok(&c->nodes[i].acct)) return false;
    return true;
}

static double wasted_ratio(const struct lull_counters *c, bool *valid) {
    *valid = c->refault_mechanism != LULL_COUNTERS_REFAULT_OFF && c->purged_pages > 0;
    return *valid ? (double)c->refault_pages / (double)c->purged_pages : 0.0;
}

static void print_flags(FILE *f, uint64_t flags) {
    static const struct {
        uint64_t bit;
        const char *name;
    } names[] = {
        {LULL_COUNTERS_F_RECLAIM_THREAD, "reclaim-thread"},
        {LULL_COUNTERS_F_DEGRADED, "degraded"},
        {LULL_COUNTERS_F_INLINE_PURGE, "inline-purge"},
        {LULL_COUNTERS_F_NODES_TRUNCATED, "nodes-truncated"},
        {LULL_COUNTERS_F_PROFILE_REQUESTS, "profile-requests"},
    };
    bool any = false;
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        if (flags & names[i].bit) {
            fprintf(f, "%s%s", any ? " " : "", names[i].name);
            any = true;
        }
    if (!any) fprintf(f, "none");
}

#define TERM_ROW(field, desc) {#field, offsetof(struct lull_counters_accounting, field)},
static const struct {
    const char *name;
    size_t off;
} term_rows[] = {{"mapped", offsetof(struct lull_counters_accounting, mapped)},
                 LULL_COUNTERS_TERMS(TERM_ROW)};
#undef TERM_ROW
#define NTERMS (sizeof term_rows / sizeof term_rows[0])

static uint64_t term(const struct lull_counters_accounting *a, size_t i) {
    uint64_t v;
    memcpy(&v, (const char *)a + term_rows[i].off, sizeof v);
    return v;
}

/* "pid 1234" as /proc shows it, and the writer's own pid when it differs
 * (a process of another PID namespace). */
static const char *pid_text(char *buf, size_t len, const struct page *pg) {
    if (pg->view_pid == pg->pid)
        snprintf(buf, len, "pid %" PRIu64, pg->pid);
    else if (pg->view_pid)
        snprintf(buf, len, "pid %" PRIu64 " (pid %" PRIu64 " in PID namespace %" PRIu64 ")",
                 pg->view_pid, pg->pid, pg->ns);
    else
        snprintf(buf, len, "pid %" PRIu64 " in PID namespace %" PRIu64 " (not visible here)",
                 pg->pid, pg->ns);
    return buf;
}

static void print_text(const struct page *pg, const struct lull_counters *c, bool stale) {
    char comm[ESCAPED_LEN(64)], h[32], lbl[24], pid[96];
    bool alive = page_writer(pg) != WRITER_GONE;
    if (alive && pg->view_pid)
        proc_comm(pg->view_pid, comm, sizeof comm);
    else
        snprintf(comm, sizeof comm, "%s", alive ? "-" : "exited");
    printf("lull counter page %s  %s (%s)  abi %" PRIu64 "%s\n", pg->shown,
           pid_text(pid, sizeof pid, pg), comm, c->abi_version, stale ? "  STALE" : "");
    if (c->seq == 0) {
        printf("nothing published yet\n");
        return;
    }
    uint64_t mono = now_ns(CLOCK_MONOTONIC);
    double age = mono > c->publish_mono_ns ? (double)(mono - c->publish_mono_ns) / 1e9 : 0.0;
    char when[64] = "?";
    time_t t = (time_t)(c->publish_real_ns / 1000000000u);
    struct tm tm;
    if (localtime_r(&t, &tm)) strftime(when, sizeof when, "%Y-%m-%d %H:%M:%S", &tm);
    printf("published %s (%.3f s ago), seq %" PRIu64 ", flags ", when, age, c->seq);
    print_flags(stdout, c->flags);
    printf("\n\n");

    /* Accounting identity. */
    uint64_t nn = node_count(c);
    printf("accounting (bytes)   %16s", "total");
    if (nn) printf(" %11s", "");
    for (uint64_t n = 0; n < nn; n++) {
        char head[32];
        snprintf(head, sizeof head, "node %s", node_label(lbl, sizeof lbl, c->nodes[n].node_id));
        printf(" %16s", head);
    }
    printf("\n");
    for (size_t i = 0; i < NTERMS; i++) {
        uint64_t v = term(&c->total, i);
        printf("  %-18s %16" PRIu64 " %11s", term_rows[i].name, v,
               human(h, sizeof h, (double)v, false));
        for (uint64_t n = 0; n < nn; n++)
            printf(" %16" PRIu64, term(&c->nodes[n].acct, i));
        printf("\n");
    }
    printf("  %-18s %16" PRIu64, "sum of terms", lull_counters_accounting_sum(&c->total));
    if (nn) printf(" %11s", "");
    for (uint64_t n = 0; n < nn; n++)
        printf(" %16" PRIu64, lull_counters_accounting_sum(&c->nodes[n].acct));
    printf("\n");
    if (all_identities_ok(c)) {
        printf("  sum == mapped: ok\n");
    } else {
        printf("  sum == mapped: MISMATCH");
        if (!identity_ok(&c->total))
            printf("  (total: %" PRIu64 " != %" PRIu64 ")", lull_counters_accounting_sum(&c->total),
                   c->total.mapped);
        for (uint64_t n = 0; n < nn; n++)
            if (!identity_ok(&c->nodes[n].acct))
                printf("  (node %s: %" PRIu64 " != %" PRIu64 ")",
                       node_label(lbl, sizeof lbl, c->nodes[n].node_id),
                       lull_counters_accounting_sum(&c->nodes[n].acct), c->nodes[n].acct.mapped);
        printf("\n");
    }
    if (nn > 0) {
        uint64_t sum = 0;
        for (uint64_t n = 0; n < nn; n++)
            sum += c->nodes[n].acct.mapped;
        printf("  nodes sum to total mapped: %s\n", sum == c->total.mapped ? "ok" : "MISMATCH");
    }

    /* Reclaim. */
    printf("\nreclaim\n");
    printf("  backend            %s, purge mode %s, purge delay ",
           lull_counters_backend_name(c->backend), lull_counters_purge_mode_name(c->purge_mode));
    if (c->purge_delay_ms == LULL_COUNTERS_DELAY_NEVER)
        printf("never\n");
    else
        printf("%" PRIu64 " ms\n", c->purge_delay_ms);
    printf("  reclaim thread     %s, cpu %.3f s, %" PRIu64 " ticks\n",
           (c->flags & LULL_COUNTERS_F_RECLAIM_THREAD) ? "running" : "not running",
           (double)c->reclaim_cpu_ns / 1e9, c->reclaim_ticks);
    printf("  %-18s %16s %16s %16s\n", "purges by backend", "calls", "syscalls", "bytes");
    for (int b = 1; b < LULL_COUNTERS_BACKEND_COUNT; b++)
        printf("    %-16s %16" PRIu64 " %16" PRIu64 " %16" PRIu64 " %11s\n",
               lull_counters_backend_name((uint64_t)b), c->purge_calls[b], c->purge_syscalls[b],
               c->purge_bytes[b], human(h, sizeof h, (double)c->purge_bytes[b], false));
    printf("  purge errors       %" PRIu64 ", backend fallbacks %" PRIu64 "\n", c->purge_errors,
           c->backend_fallbacks);
    printf("  huge unmapped      %" PRIu64 " blocks, %" PRIu64 " bytes (%s)\n", c->huge_unmapped,
           c->huge_unmapped_bytes, human(h, sizeof h, (double)c->huge_unmapped_bytes, false));
    huge_cache_sum hc = huge_cache_of(c);
    printf("  huge cache         %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64 " bytes (%s)\n",
           hc.hits, hc.misses, hc.bytes, human(h, sizeof h, (double)hc.bytes, false));
    static const char *const thp_states[] = {"off", "on", "unavailable"};
    printf("  huge pages (thp)   %s: %" PRIu64 " bytes in regions lull collapsed (%s), %" PRIu64
           " collapses, %" PRIu64 " failed, %" PRIu64 " splits, %" PRIu64 " whole purges, %" PRIu64
           " bytes held in %" PRIu64 " regions, %" PRIu64 " regions prefaulted huge\n",
           c->thp.state < 3 ? thp_states[c->thp.state] : "?", c->thp.huge_bytes,
           human(h, sizeof h, (double)c->thp.huge_bytes, false), c->thp.collapses,
           c->thp.collapse_failures, c->thp.splits, c->thp.whole_purges, c->thp.held_bytes,
           c->thp.held_regions, c->thp.prefaulted_regions);
    printf("  malloc calls       %" PRIu64 "\n", c->malloc_count);
    printf("  free calls         %" PRIu64 "\n", c->free_count);

    /* Refault. */
    bool valid;
    double ratio = wasted_ratio(c, &valid);
    printf("\nrefault\n");
    printf("  mechanism          %s\n", lull_counters_refault_name(c->refault_mechanism));
    printf("  purged pages       %" PRIu64 " (page size %" PRIu64 ")\n", c->purged_pages,
           c->page_size);
    printf("  refaulted pages    %" PRIu64 "\n", c->refault_pages);
    if (valid)
        printf("  wasted-purge ratio %.4f (%.2f%% of purged pages came back)\n", ratio,
               ratio * 100);
    else
        printf("  wasted-purge ratio n/a\n");
    uint64_t nref = 0;
    for (int i = 0; i < LULL_COUNTERS_REFAULT_BUCKETS; i++)
        nref += c->refault_distance[i];
    if (nref) printf("  mean distance      %.1f ms\n", (double)c->refault_distance_ms_sum / nref);
    printf("  distance (ms)     ");
    for (unsigned i = 0; i < LULL_COUNTERS_REFAULT_BUCKETS; i++) {
        char range[32];
        if (i == LULL_COUNTERS_REFAULT_BUCKETS - 1)
            snprintf(range, sizeof range, ">=%" PRIu64, lull_counters_refault_bucket_min_ms(i));
        else
            snprintf(range, sizeof range, "<%" PRIu64, lull_counters_refault_bucket_min_ms(i + 1));
        if (i && i % 4 == 0) printf("\n                   ");
        printf(" %8s:%8" PRIu64, range, c->refault_distance[i]);
    }
    printf("\n");
    if (nn > 1) {
        printf("  %-18s %16s %16s\n", "by node", "purged bytes", "refault pages");
        for (uint64_t n = 0; n < nn; n++)
            printf("    node %-11s %16" PRIu64 " %16" PRIu64 "\n",
                   node_label(lbl, sizeof lbl, c->nodes[n].node_id), c->nodes[n].purge_bytes,
                   c->nodes[n].refault_pages);
    }

    char config[ESCAPED_LEN(sizeof c->config)];
    printf("\nconfig\n  %s\n", c->config[0] ? escape(config, sizeof config, c->config) : "(empty)");
}

/* --------------------------------------------------------------- JSON */

static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\')
            fprintf(f, "\\%c", ch);
        else if (ch < 0x20 || ch >= 0x7f)
            fprintf(f, "\\u%04x", ch);
        else
            fputc(ch, f);
    }
    fputc('"', f);
}

static void json_accounting(FILE *f, const struct lull_counters_accounting *a) {
    for (size_t i = 0; i < NTERMS; i++)
        fprintf(f, "%s\"%s\":%" PRIu64, i ? "," : "", term_rows[i].name, term(a, i));
    fprintf(f, ",\"identity_ok\":%s", identity_ok(a) ? "true" : "false");
}

static void print_json(const struct page *pg, const struct lull_counters *c, bool stale) {
    FILE *f = stdout;
    fprintf(f, "{\"page\":");
    json_string(f, pg->name);
    /* pid: as /proc shows it (0: not visible here); ns_pid: the writer's
     * own, in its PID namespace (the page header's) */
    fprintf(f,
            ",\"abi_version\":%" PRIu64 ",\"pid\":%" PRIu64 ",\"ns_pid\":%" PRIu64
            ",\"start_time\":%" PRIu64 ",\"alive\":%s,\"stale\":%s,\"seq\":%" PRIu64
            ",\"publish_mono_ns\":%" PRIu64 ",\"publish_real_ns\":%" PRIu64 ",\"flags\":%" PRIu64
            ",\"page_size\":%" PRIu64,
            c->abi_version, pg->view_pid, c->pid, c->start_time,
            page_writer(pg) == WRITER_ALIVE ? "true" : "false", stale ? "true" : "false", c->seq,
            c->publish_mono_ns, c->publish_real_ns, c->flags, c->page_size);
    fprintf(f, ",\"accounting\":{");
    json_accounting(f, &c->total);
    fprintf(f, "},\"identity_ok\":%s,\"nodes\":[", all_identities_ok(c) ? "true" : "false");
    for (uint64_t n = 0; n < node_count(c); n++) {
        const struct lull_counters_node *nd = &c->nodes[n];
        fprintf(f, "%s{\"node\":", n ? "," : "");
        if (nd->node_id == LULL_COUNTERS_NODE_OTHER)
            fprintf(f, "\"other\"");
        else
            fprintf(f, "%" PRIu64, nd->node_id);
        fprintf(f, ",");
        json_accounting(f, &nd->acct);
        fprintf(f, ",\"purge_bytes\":%" PRIu64 ",\"refault_pages\":%" PRIu64 "}", nd->purge_bytes,
                nd->refault_pages);
    }
    fprintf(f, "],\"reclaim\":{\"backend\":\"%s\",\"purge_mode\":\"%s\",\"purge_delay_ms\":",
            lull_counters_backend_name(c->backend), lull_counters_purge_mode_name(c->purge_mode));
    if (c->purge_delay_ms == LULL_COUNTERS_DELAY_NEVER)
        fprintf(f, "null");
    else
        fprintf(f, "%" PRIu64, c->purge_delay_ms);
    fprintf(f,
            ",\"thread_running\":%s,\"cpu_ns\":%" PRIu64 ",\"ticks\":%" PRIu64
            ",\"purge_errors\":%" PRIu64 ",\"backend_fallbacks\":%" PRIu64
            ",\"huge_unmapped\":%" PRIu64 ",\"huge_unmapped_bytes\":%" PRIu64
            ",\"huge_cache\":{\"hits\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"bytes\":%" PRIu64
            "},\"purges\":{",
            (c->flags & LULL_COUNTERS_F_RECLAIM_THREAD) ? "true" : "false", c->reclaim_cpu_ns,
            c->reclaim_ticks, c->purge_errors, c->backend_fallbacks, c->huge_unmapped,
            c->huge_unmapped_bytes, huge_cache_of(c).hits, huge_cache_of(c).misses,
            huge_cache_of(c).bytes);
    for (int b = 1; b < LULL_COUNTERS_BACKEND_COUNT; b++)
        fprintf(f,
                "%s\"%s\":{\"calls\":%" PRIu64 ",\"syscalls\":%" PRIu64 ",\"bytes\":%" PRIu64 "}",
                b > 1 ? "," : "", lull_counters_backend_name((uint64_t)b), c->purge_calls[b],
                c->purge_syscalls[b], c->purge_bytes[b]);
    bool valid;
    double ratio = wasted_ratio(c, &valid);
    fprintf(f,
            "}},\"malloc_count\":%" PRIu64 ",\"free_count\":%" PRIu64
            ",\"refault\":{\"mechanism\":\"%s\",\"purged_pages\":%" PRIu64
            ",\"refault_pages\":%" PRIu64 ",\"wasted_purge_ratio\":",
            c->malloc_count, c->free_count, lull_counters_refault_name(c->refault_mechanism),
            c->purged_pages, c->refault_pages);
    if (valid)
        fprintf(f, "%.6g", ratio);
    else
        fprintf(f, "null");
    fprintf(f, ",\"distance_ms_sum\":%" PRIu64 ",\"distance_ms_buckets\":[",
            c->refault_distance_ms_sum);
    for (unsigned i = 0; i < LULL_COUNTERS_REFAULT_BUCKETS; i++)
        fprintf(f, "%s{\"min_ms\":%" PRIu64 ",\"count\":%" PRIu64 "}", i ? "," : "",
                lull_counters_refault_bucket_min_ms(i), c->refault_distance[i]);
    fprintf(f, "]},\"config\":");
    json_string(f, c->config);
    fprintf(f, "}\n");
}

/* ---------------------------------------------------------- Prometheus */

static void prom_head(const char *name, const char *type, const char *help) {
    printf("# HELP lull_%s %s\n# TYPE lull_%s %s\n", name, help, name, type);
}

static const char *strip_bytes(const char *s) {
    return strncmp(s, "bytes ", 6) == 0 ? s + 6 : s;
}

static void print_prom(const struct page *pg, const struct lull_counters *c) {
    char pid[32], lbl[24];
    snprintf(pid, sizeof pid, "pid=\"%" PRIu64 "\"", pg->view_pid ? pg->view_pid : c->pid);

    prom_head("info", "gauge",
              "lull counter page: ABI version, purge backend and mechanisms in use");
    printf("lull_info{%s,abi_version=\"%" PRIu64 "\",backend=\"%s\",purge_mode=\"%s\",refault="
           "\"%s\"} 1\n",
           pid, c->abi_version, lull_counters_backend_name(c->backend),
           lull_counters_purge_mode_name(c->purge_mode),
           lull_counters_refault_name(c->refault_mechanism));
    prom_head("publish_timestamp_seconds", "gauge", "Wall-clock time of the last publication.");
    printf("lull_publish_timestamp_seconds{%s} %.3f\n", pid, (double)c->publish_real_ns / 1e9);

    /* The identity: the process-wide total per term, and per node in a
     * separate family so that sums never count twice. */
#define TERM_HELP(field, desc) {#field, desc},
    static const struct {
        const char *name, *help;
    } helps[] = {{"mapped", "address space lull has mapped"}, LULL_COUNTERS_TERMS(TERM_HELP)};
#undef TERM_HELP
    for (size_t i = 0; i < NTERMS; i++) {
        char name[64], help[160];
        snprintf(name, sizeof name, "%s_bytes", term_rows[i].name);
        snprintf(help, sizeof help, "Bytes %s; process total.", strip_bytes(helps[i].help));
        prom_head(name, "gauge", help);
        printf("lull_%s{%s} %" PRIu64 "\n", name, pid, term(&c->total, i));
    }
    for (size_t i = 0; i < NTERMS; i++) {
        char name[64], help[160];
        snprintf(name, sizeof name, "node_%s_bytes", term_rows[i].name);
        snprintf(help, sizeof help, "Bytes %s; per NUMA node.", strip_bytes(helps[i].help));
        prom_head(name, "gauge", help);
        for (uint64_t n = 0; n < node_count(c); n++)
            printf("lull_%s{%s,node=\"%s\"} %" PRIu64 "\n", name, pid,
                   node_label(lbl, sizeof lbl, c->nodes[n].node_id), term(&c->nodes[n].acct, i));
    }
    prom_head("accounting_identity_ok", "gauge",
              "1 if the accounting terms sum to mapped, overall and on every node.");
    printf("lull_accounting_identity_ok{%s} %d\n", pid, all_identities_ok(c) ? 1 : 0);

    prom_head("purge_calls_total", "counter", "Ranges purged, by backend.");
    for (int b = 1; b < LULL_COUNTERS_BACKEND_COUNT; b++)
        printf("lull_purge_calls_total{%s,backend=\"%s\"} %" PRIu64 "\n", pid,
               lull_counters_backend_name((uint64_t)b), c->purge_calls[b]);
    prom_head("purge_syscalls_total", "counter",
              "System calls made to purge (retries and failed calls included), by backend.");
    for (int b = 1; b < LULL_COUNTERS_BACKEND_COUNT; b++)
        printf("lull_purge_syscalls_total{%s,backend=\"%s\"} %" PRIu64 "\n", pid,
               lull_counters_backend_name((uint64_t)b), c->purge_syscalls[b]);
    prom_head("purge_bytes_total", "counter", "Bytes purged, by backend.");
    for (int b = 1; b < LULL_COUNTERS_BACKEND_COUNT; b++)
        printf("lull_purge_bytes_total{%s,backend=\"%s\"} %" PRIu64 "\n", pid,
               lull_counters_backend_name((uint64_t)b), c->purge_bytes[b]);
    prom_head("node_purge_bytes_total", "counter", "Bytes purged, per NUMA node.");
    for (uint64_t n = 0; n < node_count(c); n++)
        printf("lull_node_purge_bytes_total{%s,node=\"%s\"} %" PRIu64 "\n", pid,
               node_label(lbl, sizeof lbl, c->nodes[n].node_id), c->nodes[n].purge_bytes);
    prom_head("purge_errors_total", "counter", "Purge operations the kernel failed.");
    printf("lull_purge_errors_total{%s} %" PRIu64 "\n", pid, c->purge_errors);
    prom_head("backend_fallbacks_total", "counter", "Switches to a lower backend or mechanism.");
    printf("lull_backend_fallbacks_total{%s} %" PRIu64 "\n", pid, c->backend_fallbacks);
    prom_head("huge_unmapped_total", "counter", "Huge blocks unmapped.");
    printf("lull_huge_unmapped_total{%s} %" PRIu64 "\n", pid, c->huge_unmapped);
    prom_head("huge_unmapped_bytes_total", "counter",
              "Bytes of huge blocks unmapped, and of shrunk blocks' tails.");
    printf("lull_huge_unmapped_bytes_total{%s} %" PRIu64 "\n", pid, c->huge_unmapped_bytes);
    huge_cache_sum hc = huge_cache_of(c);
    prom_head("huge_cache_hits_total", "counter", "Huge allocations that reused a cached mapping.");
    printf("lull_huge_cache_hits_total{%s} %" PRIu64 "\n", pid, hc.hits);
    prom_head("huge_cache_misses_total", "counter", "Huge allocations that mapped anew.");
    printf("lull_huge_cache_misses_total{%s} %" PRIu64 "\n", pid, hc.misses);
    prom_head("huge_cache_bytes", "gauge", "Bytes of freed huge mappings kept for reuse.");
    printf("lull_huge_cache_bytes{%s} %" PRIu64 "\n", pid, hc.bytes);
    prom_head("purge_delay_seconds", "gauge", "Purge delay in force (absent if purging is off).");
    if (c->purge_delay_ms != LULL_COUNTERS_DELAY_NEVER)
        printf("lull_purge_delay_seconds{%s} %.3f\n", pid, (double)c->purge_delay_ms / 1e3);
    prom_head("reclaim_cpu_seconds_total", "counter", "CPU time of the reclaim thread.");
    printf("lull_reclaim_cpu_seconds_total{%s} %.9f\n", pid, (double)c->reclaim_cpu_ns / 1e9);
    prom_head("reclaim_ticks_total", "counter", "Reclaim thread ticks.");
    printf("lull_reclaim_ticks_total{%s} %" PRIu64 "\n", pid, c->reclaim_ticks);
    prom_head("malloc_calls_total", "counter", "Allocation calls.");
    printf("lull_malloc_calls_total{%s} %" PRIu64 "\n", pid, c->malloc_count);
    prom_head("free_calls_total", "counter", "Free calls.");
    printf("lull_free_calls_total{%s} %" PRIu64 "\n", pid, c->free_count);
    prom_head("purged_pages_total", "counter", "Pages purged.");
    printf("lull_purged_pages_total{%s} %" PRIu64 "\n", pid, c->purged_pages);
    prom_head("refault_pages_total", "counter", "Purged pages touched again.");
    printf("lull_refault_pages_total{%s} %" PRIu64 "\n", pid, c->refault_pages);
    prom_head("node_refault_pages_total", "counter", "Purged pages touched again, per NUMA node.");
    for (uint64_t n = 0; n < node_count(c); n++)
        printf("lull_node_refault_pages_total{%s,node=\"%s\"} %" PRIu64 "\n", pid,
               node_label(lbl, sizeof lbl, c->nodes[n].node_id), c->nodes[n].refault_pages);
    bool valid;
    double ratio = wasted_ratio(c, &valid);
    prom_head("wasted_purge_ratio", "gauge",
              "Refaulted pages / purged pages (absent when no refault monitor runs).");
    if (valid) printf("lull_wasted_purge_ratio{%s} %.6g\n", pid, ratio);

    prom_head("refault_distance_seconds", "histogram", "Time from purge to refault.");
    uint64_t cum = 0;
    for (unsigned i = 0; i < LULL_COUNTERS_REFAULT_BUCKETS; i++) {
        cum += c->refault_distance[i];
        if (i == LULL_COUNTERS_REFAULT_BUCKETS - 1)
            printf("lull_refault_distance_seconds_bucket{%s,le=\"+Inf\"} %" PRIu64 "\n", pid, cum);
        else
            printf("lull_refault_distance_seconds_bucket{%s,le=\"%g\"} %" PRIu64 "\n", pid,
                   (double)lull_counters_refault_bucket_min_ms(i + 1) / 1e3, cum);
    }
    printf("lull_refault_distance_seconds_sum{%s} %.3f\n", pid,
           (double)c->refault_distance_ms_sum / 1e3);
    printf("lull_refault_distance_seconds_count{%s} %" PRIu64 "\n", pid, cum);
}

/* ------------------------------------------------------- interval mode */

static volatile sig_atomic_t stop;
static void on_signal(int sig) {
    (void)sig;
    stop = 1;
}

static void interval_header(void) {
    printf("%8s %7s %7s %7s %7s %7s %7s %7s %8s %9s %8s %8s %6s %7s\n", "time", "mapped", "live",
           "spfree", "dirty", "purged", "warm", "meta", "purge/s", "refault/s", "malloc/s",
           "free/s", "rcpu%", "delay");
}

static void interval_line(const struct lull_counters *c, const struct lull_counters *prev) {
    char t[16], b[7][16], r[4][16];
    time_t now = time(NULL);
    struct tm tm;
    localtime_r(&now, &tm);
    strftime(t, sizeof t, "%H:%M:%S", &tm);
    const struct lull_counters_accounting *a = &c->total;
    human(b[0], 16, (double)a->mapped, true);
    human(b[1], 16, (double)a->live, true);
    human(b[2], 16, (double)a->span_free, true);
    human(b[3], 16, (double)a->dirty, true);
    human(b[4], 16, (double)a->purged, true);
    human(b[5], 16, (double)a->warm, true);
    human(b[6], 16, (double)a->metadata, true);
    char cpu[16] = "-", delay[24];
    for (int i = 0; i < 4; i++)
        snprintf(r[i], 16, "-");
    if (prev) {
        double dt = (double)(c->publish_mono_ns - prev->publish_mono_ns) / 1e9;
        if (c->publish_mono_ns <= prev->publish_mono_ns) dt = 0;
        uint64_t pb = 0, ppb = 0;
        for (int i = 0; i < LULL_COUNTERS_BACKEND_COUNT; i++) {
            pb += c->purge_bytes[i];
            ppb += prev->purge_bytes[i];
        }
        if (dt > 0) {
            human(r[0], 16, (double)(pb - ppb) / dt, true);
            count_compact(r[1], 16, (double)(c->refault_pages - prev->refault_pages) / dt);
            count_compact(r[2], 16, (double)(c->malloc_count - prev->malloc_count) / dt);
            count_compact(r[3], 16, (double)(c->free_count - prev->free_count) / dt);
            snprintf(cpu, sizeof cpu, "%.1f",
                     (double)(c->reclaim_cpu_ns - prev->reclaim_cpu_ns) / 1e9 / dt * 100);
        } else {
            for (int i = 0; i < 4; i++)
                snprintf(r[i], 16, "0");
            snprintf(cpu, sizeof cpu, "0.0");
        }
    }
    if (c->purge_delay_ms == LULL_COUNTERS_DELAY_NEVER)
        snprintf(delay, sizeof delay, "never");
    else
        snprintf(delay, sizeof delay, "%" PRIu64, c->purge_delay_ms);
    printf("%8s %7s %7s %7s %7s %7s %7s %7s %8s %9s %8s %8s %6s %7s%s\n", t, b[0], b[1], b[2], b[3],
           b[4], b[5], b[6], r[0], r[1], r[2], r[3], cpu, delay,
           all_identities_ok(c) ? "" : "  MISMATCH");
}

/* ------------------------------------------------------- list / clean */

static bool parse_u64(const char *s, uint64_t *out) {
    char *end;
    if (!s || !*s || *s == '-') return false;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end) return false;
    *out = v;
    return true;
}

struct entry {
    char name[NAME_MAX + 2];               /* "/lull.1234" */
    char shown[ESCAPED_LEN(NAME_MAX + 2)]; /* as printed (escaped) */
    bool readable;
    bool counter_page; /* magic ok */
    int locked;        /* page_locked() when it was read */
    enum name_kind kind;
    uint64_t ns;                       /* NAME_PIDNS: the namespace */
    uint64_t pid, start_time, version; /* the header's */
    uint64_t view_pid;                 /* pid as /proc shows it; 0 unknown */
    uid_t uid;
    dev_t dev;
    ino_t ino;
    time_t mtime;
    int open_errno;
    bool profile; /* not a page: a heap profile file, lull.*.heap, left by --heap-profile */
};

static bool has_profile_suffix(const char *name) {
    size_t n = strlen(name), k = sizeof LULL_COUNTERS_PROFILE_SUFFIX - 1;
    return n > k && strcmp(name + n - k, LULL_COUNTERS_PROFILE_SUFFIX) == 0;
}

/* Pages in /dev/shm: names lull.* and any readable object with the magic. */
static size_t scan_pages(struct entry **out) {
    DIR *d = opendir(LULL_COUNTERS_SHM_DIR);
    size_t n = 0, cap = 0;
    *out = NULL;
    if (!d) {
        err("%s: %s", LULL_COUNTERS_SHM_DIR, strerror(errno));
        return 0;
    }
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.') continue;
        bool by_name = strncmp(de->d_name, "lull.", 5) == 0;
        struct stat st;
        if (fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISREG(st.st_mode))
            continue;
        struct entry e = {0};
        snprintf(e.name, sizeof e.name, "/%s", de->d_name);
        escape(e.shown, sizeof e.shown, e.name);
        e.uid = st.st_uid;
        e.dev = st.st_dev;
        e.ino = st.st_ino;
        e.mtime = st.st_mtime;
        e.locked = -1;
        e.kind = name_kind_of(de->d_name, &e.ns);
        int fd = openat(dirfd(d), de->d_name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
        if (fd >= 0) {
            uint64_t hdr[5] = {0};
            struct stat fst;
            e.readable = fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode);
            if (e.readable && pread(fd, hdr, sizeof hdr, 0) == (ssize_t)sizeof hdr &&
                hdr[0] == LULL_COUNTERS_MAGIC) {
                e.counter_page = true;
                e.version = hdr[1];
                e.pid = hdr[3];
                e.start_time = hdr[4];
            }
            if (e.readable) e.locked = page_locked(fd);
            close(fd);
            if (!e.readable) continue; /* replaced by something else meanwhile */
        } else {
            e.open_errno = errno;
        }
        if (!by_name && !e.counter_page) continue;
        e.profile = !e.counter_page && has_profile_suffix(de->d_name);
        if (!e.counter_page) { /* unreadable or not initialised: pid from the name */
            char *end;
            unsigned long long v = strtoull(de->d_name + 5, &end, 10);
            e.pid = (by_name && (*end == '\0' || e.kind == NAME_PIDNS)) ? v : 0;
        }
        e.view_pid = e.kind == NAME_PIDNS ? view_pid_of(e.ns, e.pid) : e.pid;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            struct entry *ne = realloc(*out, cap * sizeof **out);
            if (!ne) break;
            *out = ne;
        }
        (*out)[n++] = e;
    }
    closedir(d);
    return n;
}

enum state { ST_ALIVE, ST_STALE, ST_UNKNOWN };

static enum state entry_state(const struct entry *e) {
    if (e->counter_page) {
        enum writer w = writer_of(e->locked, e->kind, e->pid, e->start_time);
        return w == WRITER_ALIVE ? ST_ALIVE : w == WRITER_GONE ? ST_STALE : ST_UNKNOWN;
    }
    if (e->locked == 1) return ST_ALIVE; /* a writer is creating it */
    /* Not readable, or no header (yet): judge by the pid in the name. */
    uint64_t st;
    if (e->kind == NAME_PLAIN && own_pidns() == PIDNS_INIT && e->pid &&
        proc_start_time(e->pid, &st) == -ESRCH)
        return ST_STALE;
    return ST_UNKNOWN;
}

static int cmp_entry(const void *a, const void *b) {
    const struct entry *x = a, *y = b;
    return strcmp(x->name, y->name);
}

static int do_list(void) {
    struct entry *es;
    size_t n = scan_pages(&es);
    qsort(es, n, sizeof *es, cmp_entry);
    /* PID as /proc shows it ("-": a process of another PID namespace that
     * cannot be seen from here) */
    printf("%-24s %8s %-7s %4s %-10s %s\n", "PAGE", "PID", "STATE", "ABI", "USER", "COMMAND");
    for (size_t i = 0; i < n; i++) {
        const struct entry *e = &es[i];
        if (e->profile) continue; /* not a page */
        enum state s = entry_state(e);
        char user[32], comm[ESCAPED_LEN(64)] = "-", abi[16] = "?";
        struct passwd *pw = getpwuid(e->uid);
        if (pw)
            snprintf(user, sizeof user, "%s", pw->pw_name);
        else
            snprintf(user, sizeof user, "%u", (unsigned)e->uid);
        if (s == ST_ALIVE && e->view_pid) proc_comm(e->view_pid, comm, sizeof comm);
        if (e->counter_page) snprintf(abi, sizeof abi, "%" PRIu64, e->version);
        const char *state = s == ST_ALIVE ? "alive" : s == ST_STALE ? "stale" : "?";
        char note[64] = "";
        if (!e->readable)
            snprintf(note, sizeof note, " (%s)", strerror(e->open_errno));
        else if (!e->counter_page)
            snprintf(note, sizeof note, " (no header)");
        char pid[24] = "-";
        if (e->view_pid) snprintf(pid, sizeof pid, "%" PRIu64, e->view_pid);
        printf("%-24s %8s %-7s %4s %-10s %s%s\n", e->shown, pid, state, abi, user, comm, note);
    }
    free(es);
    return EX_OK;
}

/* The names a pid or name on the command line selects: a name itself; for
 * a pid its plain page name, the name a process of this lullstat's PID
 * namespace with that pid would have, and the default page name of the
 * process /proc/PID if it runs. */
struct wanted {
    char names[3][NAME_MAX + 2];
};

static void clean_wanted(const char *sel, struct wanted *w) {
    uint64_t pid, ns_pid;
    memset(w, 0, sizeof *w);
    if (!parse_u64(sel, &pid)) {
        snprintf(w->names[0], sizeof w->names[0], "%s%s", sel[0] == '/' ? "" : "/", sel);
        return;
    }
    snprintf(w->names[0], sizeof w->names[0], "%s%" PRIu64, LULL_COUNTERS_NAME_PREFIX, pid);
    uint64_t ns = own_pidns();
    if (ns && ns != PIDNS_INIT)
        snprintf(w->names[1], sizeof w->names[1], "%s%" PRIu64 ".%" PRIu64,
                 LULL_COUNTERS_NAME_PREFIX, pid, ns);
    uint64_t st;
    if (proc_start_time(pid, &st) == 0)
        default_page_name(pid, w->names[2], sizeof w->names[2], &ns_pid);
}

/* Is entry e one of the pages named on the command line (a pid or a name)? */
static bool clean_selected(const struct entry *e, const struct wanted *want, int nsel,
                           bool *found) {
    for (int i = 0; i < nsel; i++)
        for (int j = 0; j < 3; j++)
            if (want[i].names[j][0] && strcmp(want[i].names[j], e->name) == 0) {
                found[i] = true;
                return true;
            }
    return false;
}

/* Remove stale pages: all of them, or only those named in sel (pids or
 * page names). */
static int do_clean(char **sel, int nsel) {
    struct entry *es;
    size_t n = scan_pages(&es);
    int rc = EX_OK, removed = 0;
    bool *found = calloc((size_t)nsel + 1, sizeof *found);
    struct wanted *want = calloc((size_t)nsel + 1, sizeof *want);
    if (!found || !want) {
        err("out of memory");
        return EX_FAIL;
    }
    for (int i = 0; i < nsel; i++)
        clean_wanted(sel[i], &want[i]);
    time_t now = time(NULL);
    for (size_t i = 0; i < n; i++) {
        const struct entry *e = &es[i];
        if (e->profile) continue; /* below, once the stale pages are gone */
        if (nsel && !clean_selected(e, want, nsel, found)) continue;
        enum state s = entry_state(e);
        /* A lull.* object with no header is garbage once it is not brand new
         * (a writer locks it and fills the header right after creating it),
         * and only the caller's own: nothing says another user's file of
         * that name is lull's, and root's --clean removed a text file of
         * another user as "no header" (session 22). Nor is a name enough
         * (lull.<pid> of a pid that is gone): root's --clean removed such a
         * file of another user as "process gone". */
        bool headerless = e->readable && !e->counter_page && e->locked == 0 && now - e->mtime > 2;
        bool foreign = !e->counter_page && e->uid != geteuid();
        bool garbage = headerless && !foreign;
        if ((s != ST_STALE && !garbage) || foreign) {
            if (nsel)
                printf("kept %s (pid %" PRIu64 ", %s)\n", e->shown, e->pid,
                       foreign         ? "no header, another user's"
                       : s == ST_ALIVE ? "alive"
                                       : "state unknown");
            continue;
        }
        /* the name must still be the file judged (someone may have removed
         * it and made another meanwhile) */
        char path[sizeof e->name + sizeof LULL_COUNTERS_SHM_DIR];
        struct stat now_st;
        snprintf(path, sizeof path, "%s%s", LULL_COUNTERS_SHM_DIR, e->name);
        if (lstat(path, &now_st) != 0 || now_st.st_dev != e->dev || now_st.st_ino != e->ino)
            continue;
        if (shm_unlink(e->name) != 0) {
            int x = errno;
            if (x == ENOENT) continue;
            err("cannot remove %s (pid %" PRIu64 "): %s", e->shown, e->pid, strerror(x));
            if (rc == EX_OK) rc = (x == EACCES || x == EPERM) ? EX_PERM : EX_FAIL;
            continue;
        }
        printf("removed %s (pid %" PRIu64 ", %s)\n", e->shown, e->pid,
               garbage && s != ST_STALE ? "no header" : "process gone");
        removed++;
    }
    /* A heap profile nobody collected goes when its page is gone (a live
     * process's page: its profile may be on its way to a lullstat), and
     * only the caller's own: it has no header either, so nothing says
     * another user's file of that name is lull's. */
    for (size_t i = 0; i < n; i++) {
        const struct entry *e = &es[i];
        if (!e->profile) continue;
        struct entry pe = *e;
        pe.name[strlen(pe.name) - (sizeof LULL_COUNTERS_PROFILE_SUFFIX - 1)] = '\0';
        if (nsel && !clean_selected(&pe, want, nsel, found)) continue;
        if (e->uid != geteuid()) {
            if (nsel) printf("kept %s (another user's)\n", e->shown);
            continue;
        }
        char path[sizeof e->name + sizeof LULL_COUNTERS_SHM_DIR];
        struct stat now_st;
        snprintf(path, sizeof path, "%s%s", LULL_COUNTERS_SHM_DIR, pe.name);
        if (lstat(path, &now_st) == 0 || errno != ENOENT) {
            if (nsel) printf("kept %s (its page is there)\n", e->shown);
            continue;
        }
        snprintf(path, sizeof path, "%s%s", LULL_COUNTERS_SHM_DIR, e->name);
        if (lstat(path, &now_st) != 0 || now_st.st_dev != e->dev || now_st.st_ino != e->ino)
            continue;
        if (unlink(path) != 0) {
            int x = errno;
            if (x == ENOENT) continue;
            err("cannot remove %s: %s", e->shown, strerror(x));
            if (rc == EX_OK) rc = (x == EACCES || x == EPERM) ? EX_PERM : EX_FAIL;
            continue;
        }
        printf("removed %s (a heap profile nobody collected; its page is gone)\n", e->shown);
        removed++;
    }
    for (int i = 0; i < nsel; i++)
        if (!found[i]) {
            char shown[ESCAPED_LEN(256)];
            err("no counter page %s", escape(shown, sizeof shown, sel[i]));
            if (rc == EX_OK) rc = EX_NOPAGE;
        }
    if (removed == 0 && nsel == 0 && rc == EX_OK) printf("no stale counter pages\n");
    free(want);
    free(found);
    free(es);
    return rc;
}

/* ------------------------------------------------------- heap profile */

/* The request block is written by lullstat and the process, word by word,
 * atomically (include/lull/counters.h, "Requests"); like every read of a
 * mapping, each access runs under bus_armed (a truncated page). false on a
 * SIGBUS. */
static bool word_load(volatile uint64_t *w, uint64_t *out) {
    if (sigsetjmp(bus_env, 1)) {
        bus_armed = 0;
        return false;
    }
    bus_armed = 1;
    *out = __atomic_load_n(w, __ATOMIC_ACQUIRE);
    bus_armed = 0;
    return true;
}

/* A new request: profile_request + 1, and never the value already answered
 * (a page someone wrote garbage into may have request == done - 1). */
static bool raise_request(volatile struct lull_counters_request *b, uint64_t *req) {
    if (sigsetjmp(bus_env, 1)) {
        bus_armed = 0;
        return false;
    }
    bus_armed = 1;
    uint64_t old = __atomic_load_n(&b->profile_request, __ATOMIC_RELAXED), want;
    do {
        want = old + 1;
        if (want == __atomic_load_n(&b->profile_done, __ATOMIC_RELAXED)) want++;
    } while (!__atomic_compare_exchange_n(&b->profile_request, &old, want, false, __ATOMIC_SEQ_CST,
                                          __ATOMIC_RELAXED));
    bus_armed = 0;
    *req = want;
    return true;
}

static uint64_t mono_ms(void) {
    return now_ns(CLOCK_MONOTONIC) / 1000000u;
}

static void nap_ms(long ms) {
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

/* "10", "0.5", "2.25": seconds, with at most 3 decimals, > 0, up to a day. */
static bool parse_seconds(const char *s, uint64_t *ms) {
    uint64_t whole = 0, frac = 0;
    int digits = 0, decimals = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; p++, digits++)
        if ((whole = whole * 10 + (uint64_t)(*p - '0')) > 86400) return false;
    if (*p == '.') {
        for (p++; *p >= '0' && *p <= '9'; p++, decimals++) {
            if (decimals == 3) return false;
            frac = frac * 10 + (uint64_t)(*p - '0');
        }
    }
    if (*p || digits + decimals == 0) return false;
    for (int i = decimals; i < 3; i++)
        frac *= 10;
    *ms = whole * 1000 + frac;
    return *ms > 0 && *ms <= 86400000u;
}

/* The directory FILE goes into must exist and be writable: checked before
 * the process is asked, so a typo does not cost a profile. */
static int check_destination(const char *file) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", file);
    char *slash = strrchr(dir, '/');
    if (!slash)
        snprintf(dir, sizeof dir, ".");
    else if (slash == dir)
        dir[1] = '\0';
    else
        *slash = '\0';
    struct stat st;
    if (stat(file, &st) == 0 && S_ISDIR(st.st_mode)) {
        err("%s is a directory: give the profile's file name", file);
        return EX_USAGE;
    }
    if (access(dir, W_OK | X_OK) != 0) {
        err("cannot write %s: %s: %s", file, dir, strerror(errno));
        return EX_FAIL;
    }
    return EX_OK;
}

/* Copy src (open) to dst; 0 or an errno. The copy goes into a new file
 * of its own next to dst (O_EXCL, mode 0600), which is then renamed over
 * dst, as a rename from /dev/shm replaces it: dst is never opened, so a
 * hard link at dst keeps the file it shares (opened with O_TRUNC, that
 * file was overwritten, and kept its mode: 0644 for a profile said to be
 * 0600), and a copy that fails (a full disk) leaves dst as it was (it was
 * truncated, then removed). */
static int copy_file(int src, const char *dst) {
    char tmp[PATH_MAX];
    const char *slash = strrchr(dst, '/');
    int dir_len = slash ? (int)(slash - dst) + 1 : 0;
    if (snprintf(tmp, sizeof tmp, "%.*s.lullstat-XXXXXX", dir_len, dst) >= (int)sizeof tmp)
        return ENAMETOOLONG;
    int out = mkostemp(tmp, O_CLOEXEC);
    if (out < 0) return errno;
    char buf[1 << 16];
    int e = fchmod(out, 0600) == 0 ? 0 : errno; /* whatever the umask */
    while (!e) {
        ssize_t n = read(src, buf, sizeof buf);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            e = errno;
            break;
        }
        if (n == 0) break;
        for (ssize_t off = 0; off < n && !e;) {
            ssize_t w = write(out, buf + off, (size_t)(n - off));
            if (w < 0 && errno != EINTR) e = errno;
            if (w > 0) off += w;
        }
    }
    if (close(out) != 0 && !e) e = errno;
    if (!e && rename(tmp, dst) != 0) e = errno;
    if (e) unlink(tmp);
    return e;
}

/* The profile the process left at src (its own regular file, owner uid)
 * becomes file: renamed, or copied and removed across file systems. */
static int take_profile(const char *src, uid_t uid, const char *file, off_t *size) {
    int fd = open(src, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        err("%s: %s (the process answered, but its profile is not there: removed meanwhile?)", src,
            strerror(errno));
        return EX_FAIL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != uid) {
        err("%s is not the process's profile (not a regular file of uid %u): left alone", src,
            (unsigned)uid);
        close(fd);
        return EX_FAIL;
    }
    *size = st.st_size;
    /* tests only (tests/test_heap_profile_request.c): the process's user
     * replaces its profile with a link to this path here, between the
     * check above and the rename below */
    const char *swap = getenv("LULLSTAT_TEST_SWAP_PROFILE");
    if (swap && !getauxval(AT_SECURE) && unlink(src) == 0 && symlink(swap, src) != 0)
        err("LULLSTAT_TEST_SWAP_PROFILE: symlink: %s", strerror(errno));
    int e = rename(src, file) == 0 ? 0 : errno;
    struct stat moved;
    if (e == 0 &&
        (lstat(file, &moved) != 0 || moved.st_dev != st.st_dev || moved.st_ino != st.st_ino)) {
        /* src was replaced between the check and the rename (its owner
         * may): what was moved is not the profile checked. Replaced by a
         * copy of the checked one, from its descriptor (or removed: it
         * is not the profile). */
        e = copy_file(fd, file);
        if (e) unlink(file);
    } else if (e == EXDEV) {
        e = copy_file(fd, file);
        if (e == 0) unlink(src);
    }
    close(fd);
    if (e) {
        err("cannot move the profile %s to %s: %s", src, file, strerror(e));
        return EX_FAIL;
    }
    return EX_OK;
}

static int profile_refused(const char *who, uint64_t status, const char *src) {
    if (status == EINVAL) {
        err("heap profiling is off in %s: start it with LULL_CONF=profile_sample_kb=512", who);
        return EX_PROFILE_OFF;
    }
    if (status == EEXIST) {
        err("%s could not write its heap profile: %s is in the way (not a regular file of the "
            "process's user, which lull leaves alone): remove it and ask again",
            who, src);
        return EX_FAIL;
    }
    if (status == EPERM) {
        err("%s could not write its heap profile: other users may replace files in %s (not "
            "sticky), so lull writes none there",
            who, LULL_COUNTERS_SHM_DIR);
        return EX_FAIL;
    }
    err("%s could not write its heap profile: %s", who,
        status <= INT_MAX ? strerror((int)status) : "unknown error");
    return EX_FAIL;
}

/* lullstat --heap-profile: ask the writer of pg (open, checked: alive) for
 * a profile and wait for it, at most timeout_ms; who names the process in
 * messages ("process 1234"). */
static int do_heap_profile(struct page *pg, const char *who, const char *file, uint64_t timeout_ms,
                           const char *timeout_text) {
    int rc = check_destination(file);
    if (rc != EX_OK) return rc;
    struct lull_counters c;
    rc = page_snapshot(pg, &c);
    if (rc != EX_OK) return rc;
    if (!(c.flags & LULL_COUNTERS_F_PROFILE_REQUESTS)) {
        err("%s does not serve heap profile requests (%s: a lull older than this lullstat%s)", who,
            pg->shown, c.seq == 0 ? ", or nothing published yet" : "");
        return EX_VERSION;
    }
    if (!(c.flags & LULL_COUNTERS_F_RECLAIM_THREAD)) {
        err("%s: its reclaim thread, which would answer, is not running", who);
        return EX_FAIL;
    }

    /* the same object, read-write this time */
    int fd = shm_open(pg->name, O_RDWR | O_NONBLOCK | O_NOFOLLOW, 0);
    if (fd < 0) {
        int e = errno;
        if (e == EACCES || e == EPERM) {
            err("%s: permission denied (asking for a profile writes to the page: run lullstat as "
                "the same user as the process, or as root)",
                pg->shown);
            return EX_PERM;
        }
        err("%s: %s", pg->shown, strerror(e));
        return EX_FAIL;
    }
    struct stat st, ro;
    if (fstat(fd, &st) != 0 || fstat(pg->fd, &ro) != 0 || st.st_dev != ro.st_dev ||
        st.st_ino != ro.st_ino) {
        err("%s was replaced while lullstat opened it", pg->shown);
        close(fd);
        return EX_FAIL;
    }
    if ((size_t)st.st_size < LULL_COUNTERS_FILE_SIZE) {
        err("%s is %zu bytes, without a request block (%zu bytes needed)", pg->shown,
            (size_t)st.st_size, (size_t)LULL_COUNTERS_FILE_SIZE);
        close(fd);
        return EX_VERSION;
    }
    void *m = mmap(NULL, LULL_COUNTERS_FILE_SIZE, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        err("%s: mmap: %s", pg->shown, strerror(errno));
        close(fd);
        return EX_FAIL;
    }
    volatile struct lull_counters_request *b = lull_counters_request_block(m);
    char src[sizeof pg->name + sizeof LULL_COUNTERS_SHM_DIR + sizeof LULL_COUNTERS_PROFILE_SUFFIX];
    snprintf(src, sizeof src, "%s%s%s", LULL_COUNTERS_SHM_DIR, pg->name,
             LULL_COUNTERS_PROFILE_SUFFIX);
    uint64_t deadline = mono_ms() + timeout_ms;

    /* one requester at a time: an OFD lock on profile_request (its liveness
     * flock is another kind of lock, which does not conflict) */
    struct flock lk = {.l_type = F_WRLCK,
                       .l_whence = SEEK_SET,
                       .l_start = LULL_COUNTERS_REQUEST_OFFSET,
                       .l_len = 8};
    while (fcntl(fd, F_OFD_SETLK, &lk) != 0) {
        if (errno != EAGAIN && errno != EACCES && errno != EINTR) {
            err("%s: cannot lock its request block: %s", pg->shown, strerror(errno));
            rc = EX_FAIL;
            goto out;
        }
        if (mono_ms() >= deadline) {
            err("another lullstat is asking %s for a heap profile: gave up after %s s", who,
                timeout_text);
            rc = EX_TIMEOUT;
            goto out;
        }
        nap_ms(10);
    }

    uint64_t req, done = 0, status = 0;
    if (!raise_request(b, &req)) {
        rc = page_truncated(pg);
        goto out;
    }
    for (;;) {
        if (!word_load(&b->profile_done, &done)) {
            rc = page_truncated(pg);
            goto out;
        }
        if ((int64_t)(done - req) >= 0) break;
        if (page_writer(pg) == WRITER_GONE) {
            err("%s exited (or exec'd) before it answered the heap profile request", who);
            rc = EX_NOPROC;
            goto out;
        }
        if (mono_ms() >= deadline) {
            err("%s did not answer the heap profile request within %s s (is it stopped? is its "
                "reclaim thread running, or stuck in a long tick?)",
                who, timeout_text);
            rc = EX_TIMEOUT;
            goto out;
        }
        nap_ms(5);
    }
    if (!word_load(&b->profile_status, &status)) {
        rc = page_truncated(pg);
        goto out;
    }
    if (status != 0) {
        rc = profile_refused(who, status, src);
        goto out;
    }
    off_t size = 0;
    rc = take_profile(src, st.st_uid, file, &size);
    if (rc == EX_OK)
        printf("heap profile of %s written to %s (%lld bytes)\n", who, file, (long long)size);
out:
    munmap(m, LULL_COUNTERS_FILE_SIZE);
    close(fd); /* and with it the lock */
    return rc;
}

/* ---------------------------------------------------------------- main */

static void usage(FILE *f) {
    fprintf(f,
            "usage: %s [options] PID\n"
            "       %s [options] --name NAME\n"
            "       %s --list | --clean [PID|NAME...]\n"
            "       %s --heap-profile [-t S] PID FILE | --heap-profile --name NAME FILE\n"
            "Print the lull counter page of a process. PID is a pid as this lullstat's\n"
            "/proc shows it; the page is shm %sPID, or %sP.NS for a process of\n"
            "another PID namespace (inode NS), in which it is pid P.\n"
            "  -i, --interval MS   one line every MS milliseconds (Ctrl-C stops)\n"
            "  -n, --count N       stop after N lines (with -i)\n"
            "  -j, --json          JSON (one object per line with -i)\n"
            "  -p, --prom          Prometheus text exposition format\n"
            "  -N, --name NAME     read the page NAME (shm_open name) instead of a pid's\n"
            "  -l, --list          list lull counter pages on this machine\n"
            "  -c, --clean         remove stale pages of processes that are gone (all, or\n"
            "                      only the pages of the PIDs / NAMEs given)\n"
            "  -H, --heap-profile  ask the process for a sampled heap profile (gzip pprof,\n"
            "                      for pprof) and write it to FILE: its reclaim thread\n"
            "                      writes it next to its page (%s/<page>%s), lullstat\n"
            "                      moves it to FILE; the process must run with\n"
            "                      LULL_CONF=profile_sample_kb=N; same user or root\n"
            "  -t, --timeout S     --heap-profile: wait at most S seconds for the answer\n"
            "                      (default 10; decimals allowed)\n"
            "  -V, --version       print the counter page ABI version this lullstat reads\n"
            "exit status: 0 ok, 1 error (also: the page was truncated while being read),\n"
            "  2 usage, 3 no such process, 4 no counter page,\n"
            "  5 unknown ABI version or not a counter page, 6 permission denied,\n"
            "  7 no consistent snapshot (writer stuck), 8 stale page (pid reused),\n"
            "  9 no answer to --heap-profile in time, 10 heap profiling is off in the process\n",
            prog, prog, prog, prog, LULL_COUNTERS_NAME_PREFIX, LULL_COUNTERS_NAME_PREFIX,
            LULL_COUNTERS_SHM_DIR, LULL_COUNTERS_PROFILE_SUFFIX);
}

int main(int argc, char **argv) {
    enum { FMT_TEXT, FMT_JSON, FMT_PROM } fmt = FMT_TEXT;
    uint64_t interval_ms = 0, count = 0;
    const char *name = NULL;
    bool list = false, clean = false, heap = false;
    uint64_t timeout_ms = 10000;
    const char *timeout_text = "10";
    bus_handler_install();
    static const struct option opts[] = {
        {"interval", required_argument, 0, 'i'}, {"count", required_argument, 0, 'n'},
        {"json", no_argument, 0, 'j'},           {"prom", no_argument, 0, 'p'},
        {"name", required_argument, 0, 'N'},     {"list", no_argument, 0, 'l'},
        {"clean", no_argument, 0, 'c'},          {"help", no_argument, 0, 'h'},
        {"version", no_argument, 0, 'V'},        {"heap-profile", no_argument, 0, 'H'},
        {"timeout", required_argument, 0, 't'},  {0, 0, 0, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "i:n:jpN:lchVHt:", opts, NULL)) != -1) {
        switch (o) {
        case 'H':
            heap = true;
            break;
        case 't':
            if (!parse_seconds(optarg, &timeout_ms)) {
                err("bad timeout \"%s\" (seconds > 0, at most 3 decimals, up to 86400)", optarg);
                return EX_USAGE;
            }
            timeout_text = optarg;
            break;
        case 'i':
            if (!parse_u64(optarg, &interval_ms) || interval_ms == 0) {
                err("bad interval \"%s\" (milliseconds > 0)", optarg);
                return EX_USAGE;
            }
            break;
        case 'n':
            if (!parse_u64(optarg, &count) || count == 0) {
                err("bad count \"%s\" (> 0)", optarg);
                return EX_USAGE;
            }
            break;
        case 'j':
            fmt = FMT_JSON;
            break;
        case 'p':
            fmt = FMT_PROM;
            break;
        case 'N':
            name = optarg;
            break;
        case 'l':
            list = true;
            break;
        case 'c':
            clean = true;
            break;
        case 'h':
            usage(stdout);
            return EX_OK;
        case 'V':
            printf("lullstat: counter page ABI version %d\n", LULL_COUNTERS_ABI_VERSION);
            return EX_OK;
        default:
            usage(stderr);
            return EX_USAGE;
        }
    }
    if (list || clean) {
        if ((optind != argc && !clean) || name || interval_ms || fmt != FMT_TEXT || heap) {
            usage(stderr);
            return EX_USAGE;
        }
        int rc = EX_OK;
        if (list) rc = do_list();
        if (clean) {
            int rc2 = do_clean(argv + optind, argc - optind);
            if (rc == EX_OK) rc = rc2;
        }
        return rc;
    }
    const char *file = NULL;
    if (heap) {
        /* PID FILE, or FILE with --name */
        if (argc - optind != (name ? 1 : 2) || interval_ms || count || fmt != FMT_TEXT) {
            usage(stderr);
            return EX_USAGE;
        }
        file = argv[argc - 1];
    } else if ((name != NULL) == (optind + 1 == argc) || optind + 1 < argc) {
        usage(stderr);
        return EX_USAGE;
    }

    struct page pg;
    uint64_t pid = 0, start = 0;
    bool stale = false;
    int rc;
    if (!name) {
        if (!parse_u64(argv[optind], &pid) || pid == 0 || pid > INT_MAX) {
            err("bad pid \"%s\"", argv[optind]);
            return EX_USAGE;
        }
        int r = proc_start_time(pid, &start);
        if (r == -ESRCH) {
            /* its page, if it was of this namespace or the initial one */
            struct wanted w;
            clean_wanted(argv[optind], &w);
            const char *left = NULL;
            for (int j = 0; j < 2 && !left; j++) {
                struct stat st;
                char path[sizeof w.names[j] + sizeof LULL_COUNTERS_SHM_DIR];
                snprintf(path, sizeof path, "%s%s", LULL_COUNTERS_SHM_DIR, w.names[j]);
                if (w.names[j][0] && stat(path, &st) == 0) left = w.names[j];
            }
            char shown[ESCAPED_LEN(NAME_MAX + 2)];
            if (left)
                err("no such process: %" PRIu64 " (its page %s is stale: lullstat --clean removes "
                    "it)",
                    pid, escape(shown, sizeof shown, left));
            else
                err("no such process: %" PRIu64, pid);
            return EX_NOPROC;
        }
        if (r != 0) {
            err("cannot read /proc/%" PRIu64 "/stat", pid);
            return EX_FAIL;
        }
        /* the name the process gave its page: lull.<pid>, or in another PID
         * namespace lull.<its pid there>.<namespace> */
        char pname[96];
        uint64_t ns_pid;
        default_page_name(pid, pname, sizeof pname, &ns_pid);
        rc = page_open(&pg, pname);
        if (rc == EX_NOPAGE) {
            err("process %" PRIu64 " has no counter page %s (not running lull, counter page off, "
                "or a named page: see --list and --name)",
                pid, pg.shown);
            if (heap)
                err("lull creates its page a second after its reclaim thread starts, which is at "
                    "its first need; without a page there is no thread to answer");
        }
        if (rc != EX_OK) return rc;
        pg.view_pid = pid;
        /* The name is predictable, and anyone may create it first: a file
         * of another user there is not the process's page, whatever its
         * header says (the process then has none: lull leaves such a file
         * alone). Its figures would be shown as the process's, and with
         * --heap-profile that user's file taken as its profile. A page of
         * root's is kept: nobody else can make one, and a server that
         * started as root and then changed its user has one. */
        if (pg.uid != 0 && proc_has_uid(pid, pg.uid) == 0) {
            err("%s belongs to uid %u, not to the user of process %" PRIu64
                ": it is not the process's counter page (another user created that name); the "
                "process has none",
                pg.shown, (unsigned)pg.uid, pid);
            page_unmap(&pg);
            return EX_NOPAGE;
        }
        uint64_t ppid = pg.pid, pstart = pg.start_time;
        /* A locked page is its live writer's: at this name, the process
         * /proc/PID. An unlocked one (an older lull's) is judged by the
         * header's start time. */
        enum writer w = page_writer(&pg);
        if (ppid != ns_pid || w == WRITER_GONE ||
            (w != WRITER_ALIVE && pstart != 0 && pstart != start)) {
            err("%s is stale: it was written by an earlier process %" PRIu64 " (start time %" PRIu64
                "), not the running process %" PRIu64 " (start time %" PRIu64
                "); lullstat --clean removes it",
                pg.shown, ppid, pstart, pid, start);
            page_unmap(&pg);
            return EX_STALE;
        }
    } else {
        rc = page_open(&pg, name);
        if (rc == EX_NOPAGE) err("no counter page %s", pg.shown);
        if (rc != EX_OK) return rc;
        pid = pg.view_pid;
        start = pg.start_time;
        if (heap && page_writer(&pg) == WRITER_GONE) {
            err("%s is stale: its process is gone, nobody would answer", pg.shown);
            page_unmap(&pg);
            return EX_STALE;
        }
        if (page_writer(&pg) == WRITER_GONE) {
            stale = true;
            char pt[96];
            err("warning: %s is stale: process %s is gone; showing its last figures", pg.shown,
                pid_text(pt, sizeof pt, &pg) + 4);
        }
    }

    if (heap) {
        char who[128], pt[96];
        snprintf(who, sizeof who, "process %s", pid_text(pt, sizeof pt, &pg) + 4);
        rc = do_heap_profile(&pg, who, file, timeout_ms, timeout_text);
        page_unmap(&pg);
        return fflush(stdout) == 0 ? rc : EX_FAIL;
    }

    struct lull_counters cur, prev;
    if (!interval_ms) {
        rc = page_snapshot(&pg, &cur);
        if (rc == EX_OK) {
            if (fmt == FMT_JSON)
                print_json(&pg, &cur, stale);
            else if (fmt == FMT_PROM)
                print_prom(&pg, &cur);
            else
                print_text(&pg, &cur, stale);
        }
        page_unmap(&pg);
        return fflush(stdout) == 0 ? rc : EX_FAIL;
    }

    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    bool have_prev = false;
    uint64_t lines = 0;
    rc = EX_OK;
    while (!stop) {
        if (!stale && page_writer(&pg) == WRITER_GONE) {
            fflush(stdout);
            err("process %" PRIu64 " exited (or replaced its program: exec)", pid);
            rc = EX_NOPROC;
            break;
        }
        rc = page_snapshot(&pg, &cur);
        if (rc != EX_OK) break;
        if (fmt == FMT_JSON) {
            print_json(&pg, &cur, stale);
        } else if (fmt == FMT_PROM) {
            print_prom(&pg, &cur);
            printf("\n");
        } else {
            if (lines % 20 == 0) interval_header();
            interval_line(&cur, have_prev ? &prev : NULL);
        }
        if (fflush(stdout) != 0) {
            rc = EX_FAIL;
            break;
        }
        prev = cur;
        have_prev = true;
        if (++lines == count) break; /* count 0: no limit */
        struct timespec ts = {(time_t)(interval_ms / 1000), (long)(interval_ms % 1000) * 1000000L};
        while (!stop && nanosleep(&ts, &ts) != 0 && errno == EINTR) {
        }
    }
    page_unmap(&pg);
    return rc;
}
