/* lull counter page: the shared-memory statistics ABI.
 *
 * A process running lull (with the counter page on) creates one POSIX
 * shared-memory object, by default "/lull.<pid>" (on Linux the file
 * /dev/shm/lull.<pid>), or "/lull.<pid>.<ns>" in a PID namespace other than
 * the initial one (<pid> its pid there, <ns> the inode of its
 * /proc/self/ns/pid), mode 0600, holding one struct lull_counters (and,
 * further on, a request block: "Requests" below). Its
 * reclaim thread republishes the figures every tick; any process of the same
 * user may map the object read-only and copy a consistent snapshot with
 * lull_counters_snapshot() below. The object is removed when the process
 * exits (exit, quick_exit, _exit, _Exit) or execs. The writer holds an
 * exclusive flock on the object from before magic is set until its process
 * exits, execs or is killed: a reader that can take LOCK_SH|LOCK_NB knows a
 * page is stale; pages of writers that do not lock (older versions) are
 * judged by (pid, start_time) no longer naming a live process.
 *
 * This header is self-contained (C99/C11/C17 or C++11, GCC or Clang) and is
 * the only thing a reader needs: lullstat is built against it alone.
 *
 * Layout rules
 *   - The six header fields magic .. seq keep their offsets in every version,
 *     so any reader can tell which version a page is and whose it is.
 *   - Every field is a uint64_t (the config text is a char array of a
 *     multiple of 8 bytes), in host byte order, with no padding: the
 *     offsets are fixed and checked by static assertions at the end.
 *   - abi_version changes whenever a field is removed, moved or changes
 *     meaning. A reader must refuse a page whose abi_version it does not know.
 *   - Fields may be added at the end without changing abi_version; `size`
 *     then grows. A reader accepts a page of its version whose size is at
 *     least sizeof(struct lull_counters) as it knows it, and reads only that
 *     prefix. A page smaller than that is refused. The struct never grows
 *     past LULL_COUNTERS_REQUEST_OFFSET; the object may be larger than
 *     `size` (the request block, "Requests" below).
 *   - Reserved fields are written as 0 and must be ignored.
 *
 * Consistency (a sequence lock)
 *   The header fields magic .. start_time are written once, before magic is
 *   set (magic is stored last, with release ordering); they never change
 *   afterwards. Everything from publish_mono_ns on is rewritten by each
 *   publication: the writer makes seq odd, rewrites the fields, and makes
 *   seq even again. A reader copies the page between two reads of seq and
 *   keeps the copy only if both reads are equal and even. seq == 0 means
 *   nothing has been published yet (all figures are 0). A seq that stays odd
 *   means the writer died in the middle of a publication.
 *
 * Requests (an addition within v1: the heap profile)
 *   The object is LULL_COUNTERS_FILE_SIZE bytes: after the published struct
 *   (whose `size` is still sizeof(struct lull_counters)), at offset
 *   LULL_COUNTERS_REQUEST_OFFSET, lies one struct lull_counters_request,
 *   which no publication ever writes (it is outside the seqlock: read and
 *   write its words one at a time, atomically). A requester (lullstat
 *   --heap-profile) maps the object read-write, which only the page's user
 *   (mode 0600) or root can, and raises profile_request; the writer's
 *   reclaim thread looks at that word at every wake-up (at most
 *   LULL_COUNTERS_REQUEST_POLL_MS apart), and when it differs from the
 *   last value it served it writes a heap profile (lull_profile_dump(),
 *   gzip pprof) to the file named like the page plus
 *   LULL_COUNTERS_PROFILE_SUFFIX in LULL_COUNTERS_SHM_DIR
 *   (/dev/shm/lull.<pid>.heap), created O_EXCL|O_NOFOLLOW mode 0600,
 *   stores profile_status (0, or the errno: EINVAL when profiling is off)
 *   and then profile_done = the request it served (release). The requester
 *   waits until profile_done reaches its request, reads profile_status,
 *   and takes the file away (rename). The writer only reads
 *   profile_request and compares it for inequality: any value is a
 *   request, and a value it has just served is none. Requesters
 *   serialise among themselves with an OFD write lock
 *   (fcntl F_OFD_SETLK) on the 8 bytes of profile_request, held from
 *   before the request until the file is taken (lull never takes it; its
 *   liveness lock is a flock, which does not conflict). A page whose
 *   published flags lack LULL_COUNTERS_F_PROFILE_REQUESTS (an older
 *   writer, or a file smaller than LULL_COUNTERS_FILE_SIZE) answers no
 *   request.
 *
 * Units: bytes unless the name says otherwise; "count" fields are
 * cumulative since the process started (monotonic, wrap only after 2^64);
 * other fields are gauges (the value at publication time). In the child
 * of a fork the counts of the reclaim thread and its purge backend (ticks,
 * purges, purge calls and bytes, unmaps) start at 0 with the child's own
 * reclaim thread, while the allocation counts (mallocs, frees, huge cache
 * hits and misses) go on from the parent's values at the fork.
 */
#ifndef LULL_COUNTERS_H
#define LULL_COUNTERS_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "LULLSTAT": the bytes of the magic as stored in a little-endian page, so a
 * hex dump of the object starts with the text LULLSTAT. */
#define LULL_COUNTERS_MAGIC UINT64_C(0x544154534c4c554c)
/* Version of the layout described by this header. */
#define LULL_COUNTERS_ABI_VERSION 1
/* Size in bytes of struct lull_counters in this version. */
#define LULL_COUNTERS_SIZE_V1 1856

/* Default object name is LULL_COUNTERS_NAME_PREFIX "<pid>" (shm_open name,
 * so the file is /dev/shm/lull.<pid>). */
#define LULL_COUNTERS_NAME_PREFIX "/lull."
#define LULL_COUNTERS_SHM_DIR "/dev/shm"

#define LULL_COUNTERS_MAX_NODES 8
#define LULL_COUNTERS_REFAULT_BUCKETS 16
#define LULL_COUNTERS_CONFIG_LEN 256
/* nodes[i].node_id of the last entry when the machine has more than
 * LULL_COUNTERS_MAX_NODES nodes: that entry sums all remaining nodes. */
#define LULL_COUNTERS_NODE_OTHER UINT64_MAX
/* purge_delay_ms when purging is off (purge delay "never"). */
#define LULL_COUNTERS_DELAY_NEVER UINT64_MAX

/* Active purge backend (field `backend`) and index of the per-backend
 * arrays purge_calls[], purge_bytes[], purge_syscalls[] (index 0 is unused
 * and stays 0). */
enum lull_counters_backend {
    LULL_COUNTERS_BACKEND_NONE = 0,            /* nothing purges (delay never, or not started) */
    LULL_COUNTERS_BACKEND_URING = 1,           /* io_uring IORING_OP_MADVISE batches */
    LULL_COUNTERS_BACKEND_PROCESS_MADVISE = 2, /* process_madvise(2) on self, iovec batches */
    LULL_COUNTERS_BACKEND_MADVISE = 3,         /* one madvise(2) per range */
    LULL_COUNTERS_BACKEND_COUNT = 4
};

/* How purged pages coming back are detected (field refault_mechanism). */
enum lull_counters_refault {
    LULL_COUNTERS_REFAULT_OFF = 0,          /* refault monitor off or unavailable */
    LULL_COUNTERS_REFAULT_UFFD_WP = 1,      /* userfaultfd WP_ASYNC + PAGEMAP_SCAN written bit */
    LULL_COUNTERS_REFAULT_PAGEMAP_SCAN = 2, /* PAGEMAP_SCAN PAGE_IS_PRESENT over purged ranges */
    LULL_COUNTERS_REFAULT_ACCOUNTING =
        3, /* no PAGEMAP_SCAN (or the monitor's calls failed after start): reuse of purged
            * slices counted by the allocator (16 pages a slice) */
    LULL_COUNTERS_REFAULT_COUNT = 4
};

/* How memory is given back (field purge_mode). */
enum lull_counters_purge_mode {
    LULL_COUNTERS_PURGE_NONE = 0,     /* not purging */
    LULL_COUNTERS_PURGE_DONTNEED = 1, /* MADV_DONTNEED: RSS drops at once */
    LULL_COUNTERS_PURGE_FREE = 2,     /* MADV_FREE: reclaimed lazily under pressure */
    LULL_COUNTERS_PURGE_COUNT = 3
};

/* Bits of field `flags`. */
#define LULL_COUNTERS_F_RECLAIM_THREAD UINT64_C(0x1) /* the reclaim thread is running */
#define LULL_COUNTERS_F_DEGRADED UINT64_C(0x2)       /* a mechanism failed; a fallback is active */
#define LULL_COUNTERS_F_INLINE_PURGE UINT64_C(0x4)   /* freeing threads purge (no reclaim thread) */
#define LULL_COUNTERS_F_NODES_TRUNCATED                                                            \
    UINT64_C(0x8) /* more nodes than MAX_NODES: see NODE_OTHER */
#define LULL_COUNTERS_F_PROFILE_REQUESTS                                                           \
    UINT64_C(0x10) /* the writer serves heap profile requests (struct lull_counters_request) */

/* The accounting identity: every byte lull has mapped is in exactly one of
 * the terms after `mapped`, so
 *     live + rounding + span_free + dirty + purging + purged + warm + metadata == mapped
 * holds exactly in every published snapshot, overall and per node. */
struct lull_counters_accounting {
    uint64_t mapped;    /* address space lull has mapped: segments, huge blocks, metadata */
    uint64_t live;      /* handed out: usable size of the live blocks */
    uint64_t rounding;  /* waste nobody can use: size-class rounding and span tails */
    uint64_t span_free; /* free blocks inside spans that are in use */
    uint64_t dirty;     /* free slices, still resident, not yet purged */
    uint64_t purging;   /* slices the reclaim thread has claimed and is purging now */
    uint64_t purged;    /* mapped but given back to the kernel: not resident after
                         * MADV_DONTNEED; after MADV_FREE (purge_mode=free, or auto while
                         * purges are wasted) resident until the kernel needs the memory
                         * or lull purges the slices again with MADV_DONTNEED (3 s) */
    uint64_t warm;      /* prefaulted reserve, resident and ready to hand out */
    uint64_t metadata;  /* segment headers and lull's own structures */
};

/* X-macro over the terms of the identity (not `mapped`), in layout order:
 * X(field, "description"). */
#define LULL_COUNTERS_TERMS(X)                                                                     \
    X(live, "bytes handed out (usable size of live blocks)")                                       \
    X(rounding, "size-class and span tail waste usable by nobody")                                 \
    X(span_free, "free blocks inside spans in use")                                                \
    X(dirty, "free slices not yet purged")                                                         \
    X(purging, "slices being purged by the reclaim thread now")                                    \
    X(purged, "mapped but given back to the kernel, not resident")                                 \
    X(warm, "prefaulted reserve")                                                                  \
    X(metadata, "segment headers and lull's own structures")

/* One NUMA node. */
struct lull_counters_node {
    uint64_t node_id;                     /* kernel node number, or LULL_COUNTERS_NODE_OTHER */
    struct lull_counters_accounting acct; /* the identity for memory placed on this node */
    uint64_t purge_bytes;                 /* count: bytes purged on this node */
    uint64_t refault_pages;               /* count: purged pages of this node touched again */
    /* Freed huge blocks' mappings kept by the reclaim thread for reuse (an
     * addition within v1: a page of an older writer has 0 here). */
    uint64_t huge_cache_hits;   /* count: huge allocations that took a freed mapping (no mmap) */
    uint64_t huge_cache_misses; /* count: huge allocations that found none and mapped anew */
    uint64_t huge_cache_bytes;  /* header slices and blocks of the cached mappings (in the
                                 * dirty, purging, purged and metadata terms above) */
    uint64_t reserved[1];
};

struct lull_counters {
    /* ---- header: written once when the page is created ---- */
    uint64_t magic;       /* LULL_COUNTERS_MAGIC, stored last (release) */
    uint64_t abi_version; /* LULL_COUNTERS_ABI_VERSION of the writer */
    uint64_t size;        /* sizeof(struct lull_counters) of the writer */
    uint64_t pid;         /* process id of the writer, in its own PID namespace */
    uint64_t start_time;  /* its start time: field 22 of /proc/<pid>/stat (clock ticks after
                           * boot); (pid, start_time) identifies the process even when the
                           * pid is reused */
    uint64_t seq;         /* sequence counter: even = stable, odd = being written */

    /* ---- published: rewritten under seq by every publication ---- */
    uint64_t publish_mono_ns;   /* CLOCK_MONOTONIC of the publication, ns */
    uint64_t publish_real_ns;   /* CLOCK_REALTIME of the publication, ns since the epoch */
    uint64_t flags;             /* LULL_COUNTERS_F_* */
    uint64_t page_size;         /* base page size, bytes (for the *_pages fields) */
    uint64_t node_count;        /* valid entries of nodes[]; the totals are their sum */
    uint64_t backend;           /* enum lull_counters_backend: the purge backend in use */
    uint64_t refault_mechanism; /* enum lull_counters_refault in use */
    uint64_t purge_mode;        /* enum lull_counters_purge_mode in use */
    uint64_t purge_delay_ms;    /* purge delay in force now (auto mode moves it);
                                 * LULL_COUNTERS_DELAY_NEVER if purging is off */
    uint64_t malloc_count;      /* count: allocation calls (malloc, calloc, new, ...), each
                                 * realloc that returns a block among them, moved or kept */
    uint64_t free_count;        /* count: free calls (free, delete, realloc to 0, ...), and
                                 * each realloc's old block, moved or kept: malloc_count -
                                 * free_count is the blocks live */
    uint64_t reclaim_cpu_ns;    /* count: CPU time of the reclaim thread, ns */
    uint64_t reclaim_ticks;     /* count: reclaim thread ticks (wake-ups that did work) */

    /* Purging by backend, indexed by enum lull_counters_backend. A "call"
     * is one range purged successfully (one SQE, one iovec or one madvise);
     * "syscalls" are every system call made to purge (io_uring_enter,
     * process_madvise, madvise): the kernel entries purging cost, so a call
     * retried after EAGAIN or EINTR counts each time, and a call that failed
     * counts too (its ranges are in purge_errors, or redone on a lower
     * backend and counted there again); not those of the warm reserve's
     * prefaults (MADV_POPULATE_WRITE: no purge). */
    uint64_t purge_calls[LULL_COUNTERS_BACKEND_COUNT];    /* count */
    uint64_t purge_bytes[LULL_COUNTERS_BACKEND_COUNT];    /* count */
    uint64_t purge_syscalls[LULL_COUNTERS_BACKEND_COUNT]; /* count */
    uint64_t purge_errors;        /* count: purge operations the kernel failed */
    uint64_t backend_fallbacks;   /* count: switches to a lower backend / mechanism (not
                                   * for a range failed with EAGAIN, EINTR, ENOMEM or,
                                   * on io_uring, ECANCELED (no io-wq worker could
                                   * start): redone below, the backend kept) */
    uint64_t huge_unmapped;       /* count: huge blocks' mappings unmapped whole (by the
                                   * reclaim thread, or by the freeing thread under
                                   * inline_purge) */
    uint64_t huge_unmapped_bytes; /* count: huge address space unmapped: those mappings'
                                   * bytes, and the tails of huge blocks realloc shrank in
                                   * place (address space the block gave up: no mapping of
                                   * its own, so not in huge_unmapped) */

    /* Refaults: purged pages that were touched again. The wasted-purge
     * ratio is refault_pages / purged_pages (computed by the reader; it is
     * meaningful only when refault_mechanism != OFF). */
    uint64_t purged_pages;            /* count: pages purged (all backends, base pages) */
    uint64_t refault_pages;           /* count: purged pages touched again */
    uint64_t refault_distance_ms_sum; /* count: sum of the distances below, ms */
    /* Time from purge to refault, one entry per refaulted page (or range),
     * log2 buckets of milliseconds: bucket 0 is [0, 1) ms, bucket i
     * (1 <= i <= 14) is [2^(i-1), 2^i) ms, bucket 15 is >= 16384 ms. See
     * lull_counters_refault_bucket(). */
    uint64_t refault_distance[LULL_COUNTERS_REFAULT_BUCKETS];

    struct lull_counters_accounting total; /* the identity over the whole process */
    struct lull_counters_node nodes[LULL_COUNTERS_MAX_NODES];

    /* The configuration in force, "key=value,..." NUL-terminated (a reader
     * should still not trust the terminator). */
    char config[LULL_COUNTERS_CONFIG_LEN];

    /* Transparent huge pages (thp=..., an addition within v1: a page of an
     * older writer has no such fields, a reader checks `size`). */
    struct lull_counters_thp {
        uint64_t state;              /* enum lull_counters_thp_state */
        uint64_t huge_bytes;         /* regions lull collapsed into huge pages, not split since */
        uint64_t collapses;          /* count: MADV_COLLAPSE of a dense 2 MiB region */
        uint64_t collapse_failures;  /* count */
        uint64_t splits;             /* count: huge regions purged piecemeal (past the bound,
                                      * lull_purge_all, the heap limit) */
        uint64_t whole_purges;       /* count: huge regions purged whole, all free */
        uint64_t held_bytes;         /* free slices and parked pages kept in huge regions
                                      * (not purged: that would split them), last tick */
        uint64_t held_regions;       /* huge regions whose free slices wait, not split (splits
                                      * avoided), last tick */
        uint64_t prefaulted_regions; /* count: regions the warm reserve made huge pages of
                                      * zeroes before use (added in v1 after held_regions) */
    } thp;
};

enum lull_counters_thp_state {
    LULL_COUNTERS_THP_OFF = 0,         /* thp=never (the default) */
    LULL_COUNTERS_THP_ON = 1,          /* lull forms and keeps huge pages */
    LULL_COUNTERS_THP_UNAVAILABLE = 2, /* asked for; the system has THP off, or no MADV_COLLAPSE */
};

/* ------------------------------------------------------------- requests */

/* Where struct lull_counters_request lies in the object: past the
 * published struct, which may grow within v1 up to this offset. */
#define LULL_COUNTERS_REQUEST_OFFSET 4096
/* The heap profile file: the page's name plus this, in the same directory
 * ("/dev/shm/lull.1234.heap"). */
#define LULL_COUNTERS_PROFILE_SUFFIX ".heap"
/* The longest interval between two looks of the writer at profile_request
 * while its reclaim thread runs and is not inside a long step (its idle
 * sleep). */
#define LULL_COUNTERS_REQUEST_POLL_MS 100

/* Written by requesters and by the writer, word by word, never by a
 * publication (see "Requests" above). */
struct lull_counters_request {
    uint64_t profile_request; /* by requesters: raise it (any new value) to ask for a profile */
    uint64_t profile_done;    /* by the writer: the last profile_request value it served */
    uint64_t profile_status;  /* by the writer, before profile_done: 0, or an errno */
    uint64_t reserved[5];
};

/* Size of the object of a writer that serves requests. */
#define LULL_COUNTERS_FILE_SIZE                                                                    \
    (LULL_COUNTERS_REQUEST_OFFSET + sizeof(struct lull_counters_request))

/* The request block of a mapping of at least LULL_COUNTERS_FILE_SIZE bytes. */
static inline volatile struct lull_counters_request *
lull_counters_request_block(volatile void *mapping) {
    return (volatile struct lull_counters_request *)((volatile char *)mapping +
                                                     LULL_COUNTERS_REQUEST_OFFSET);
}

/* ---------------------------------------------------------------- helpers */

static inline const char *lull_counters_backend_name(uint64_t b) {
    switch (b) {
    case LULL_COUNTERS_BACKEND_NONE:
        return "none";
    case LULL_COUNTERS_BACKEND_URING:
        return "uring";
    case LULL_COUNTERS_BACKEND_PROCESS_MADVISE:
        return "process_madvise";
    case LULL_COUNTERS_BACKEND_MADVISE:
        return "madvise";
    default:
        return "unknown";
    }
}

static inline const char *lull_counters_refault_name(uint64_t m) {
    switch (m) {
    case LULL_COUNTERS_REFAULT_OFF:
        return "off";
    case LULL_COUNTERS_REFAULT_UFFD_WP:
        return "uffd_wp";
    case LULL_COUNTERS_REFAULT_PAGEMAP_SCAN:
        return "pagemap_scan";
    case LULL_COUNTERS_REFAULT_ACCOUNTING:
        return "accounting";
    default:
        return "unknown";
    }
}

static inline const char *lull_counters_purge_mode_name(uint64_t m) {
    switch (m) {
    case LULL_COUNTERS_PURGE_NONE:
        return "none";
    case LULL_COUNTERS_PURGE_DONTNEED:
        return "dontneed";
    case LULL_COUNTERS_PURGE_FREE:
        return "free";
    default:
        return "unknown";
    }
}

/* Bucket of refault_distance[] for a distance of `ms` milliseconds. */
static inline unsigned lull_counters_refault_bucket(uint64_t ms) {
    if (ms == 0) return 0;
    unsigned b = 64u - (unsigned)__builtin_clzll(ms); /* ms in [2^(b-1), 2^b) */
    return b < LULL_COUNTERS_REFAULT_BUCKETS - 1 ? b : LULL_COUNTERS_REFAULT_BUCKETS - 1;
}

/* Lower bound in ms of bucket i (0, 1, 2, 4, ..., 16384). */
static inline uint64_t lull_counters_refault_bucket_min_ms(unsigned i) {
    return i == 0 ? 0 : UINT64_C(1) << (i - 1);
}

/* live + rounding + ... + metadata (everything but mapped). */
static inline uint64_t lull_counters_accounting_sum(const struct lull_counters_accounting *a) {
    return a->live + a->rounding + a->span_free + a->dirty + a->purging + a->purged + a->warm +
           a->metadata;
}

/* The bytes of lull's mapping that may be resident: everything but the
 * purged term (metadata counts whole, so this is an upper bound while
 * purges use MADV_DONTNEED). A process's RSS growth beyond the growth of
 * this figure is not lull's, except for pages purged with MADV_FREE, which
 * the kernel leaves in RSS until it needs the memory (it takes them before
 * anything else; lull purges them again with MADV_DONTNEED after 3 s). */
static inline uint64_t lull_counters_resident_bound(const struct lull_counters_accounting *a) {
    return lull_counters_accounting_sum(a) - a->purged;
}

/* Word of the page as the seqlock copies it (may alias every field). */
typedef uint64_t __attribute__((__may_alias__)) lull_counters_word;

/* Inner attempts of lull_counters_snapshot() before it gives up. */
#define LULL_COUNTERS_SNAPSHOT_TRIES 4096

/* Copy a consistent snapshot of `page` (a mapping of at least
 * sizeof(struct lull_counters) bytes) into *out. Returns 0, or -EAGAIN if
 * no stable copy was obtained in LULL_COUNTERS_SNAPSHOT_TRIES attempts (the
 * writer is busy or died mid-publication: sleep and call again, and after
 * a while report a stuck writer). out->seq holds the (even) sequence
 * number of the copy. Does not check magic, version or size: check those on
 * the header first (they do not change once magic is set). */
static inline int lull_counters_snapshot(const volatile struct lull_counters *page,
                                         struct lull_counters *out) {
    const volatile lull_counters_word *src = (const volatile lull_counters_word *)page;
    const volatile lull_counters_word *seqp = (const volatile lull_counters_word *)&page->seq;
    const size_t words = sizeof(struct lull_counters) / sizeof(uint64_t);
    for (int attempt = 0; attempt < LULL_COUNTERS_SNAPSHOT_TRIES; attempt++) {
        /* Acquire: the copy below cannot be hoisted above this load, so it
         * sees at least the data of publication s1. */
        uint64_t s1 = __atomic_load_n(seqp, __ATOMIC_ACQUIRE);
        if (s1 & 1) {
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ __volatile__("yield" ::: "memory");
#endif
            continue;
        }
        /* Acquire loads: the copy's loads complete before the second read
         * of seq; if any of them saw a later publication's (release)
         * store, the second read sees that publication's odd (or later)
         * seq. (Acquire loads rather than relaxed ones and a fence:
         * ThreadSanitizer does not model fences; on x86 all are plain
         * moves.) */
        for (size_t i = 0; i < words; i++) {
            uint64_t w = __atomic_load_n(&src[i], __ATOMIC_ACQUIRE);
            __builtin_memcpy((char *)out + i * sizeof(uint64_t), &w, sizeof w);
        }
        uint64_t s2 = __atomic_load_n(seqp, __ATOMIC_RELAXED);
        if (s1 == s2) {
            out->seq = s1;
            return 0;
        }
    }
    return -EAGAIN;
}

/* ------------------------------------------------------- layout checks */

#ifdef __cplusplus
#define LULL_COUNTERS_STATIC_ASSERT static_assert
#else
#define LULL_COUNTERS_STATIC_ASSERT _Static_assert
#endif
#define LULL_COUNTERS_AT(field, off)                                                               \
    LULL_COUNTERS_STATIC_ASSERT(offsetof(struct lull_counters, field) == (off),                    \
                                "lull_counters layout: " #field)
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters_accounting) == 9 * 8, "accounting size");
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters_node) == 16 * 8, "node size");
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters) == LULL_COUNTERS_SIZE_V1,
                            "lull_counters size");
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters) % 8 == 0, "whole words");
LULL_COUNTERS_AT(magic, 0);
LULL_COUNTERS_AT(abi_version, 8);
LULL_COUNTERS_AT(size, 16);
LULL_COUNTERS_AT(pid, 24);
LULL_COUNTERS_AT(start_time, 32);
LULL_COUNTERS_AT(seq, 40);
LULL_COUNTERS_AT(publish_mono_ns, 48);
LULL_COUNTERS_AT(publish_real_ns, 56);
LULL_COUNTERS_AT(flags, 64);
LULL_COUNTERS_AT(page_size, 72);
LULL_COUNTERS_AT(node_count, 80);
LULL_COUNTERS_AT(backend, 88);
LULL_COUNTERS_AT(refault_mechanism, 96);
LULL_COUNTERS_AT(purge_mode, 104);
LULL_COUNTERS_AT(purge_delay_ms, 112);
LULL_COUNTERS_AT(malloc_count, 120);
LULL_COUNTERS_AT(free_count, 128);
LULL_COUNTERS_AT(reclaim_cpu_ns, 136);
LULL_COUNTERS_AT(reclaim_ticks, 144);
LULL_COUNTERS_AT(purge_calls, 152);
LULL_COUNTERS_AT(purge_bytes, 184);
LULL_COUNTERS_AT(purge_syscalls, 216);
LULL_COUNTERS_AT(purge_errors, 248);
LULL_COUNTERS_AT(backend_fallbacks, 256);
LULL_COUNTERS_AT(huge_unmapped, 264);
LULL_COUNTERS_AT(huge_unmapped_bytes, 272);
LULL_COUNTERS_AT(purged_pages, 280);
LULL_COUNTERS_AT(refault_pages, 288);
LULL_COUNTERS_AT(refault_distance_ms_sum, 296);
LULL_COUNTERS_AT(refault_distance, 304);
LULL_COUNTERS_AT(total, 432);
LULL_COUNTERS_AT(nodes, 504);
LULL_COUNTERS_AT(config, 1528);
LULL_COUNTERS_AT(thp, 1784);
#undef LULL_COUNTERS_AT
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters) <= LULL_COUNTERS_REQUEST_OFFSET,
                            "the request block lies after the published struct");
LULL_COUNTERS_STATIC_ASSERT(sizeof(struct lull_counters_request) == 8 * 8, "request block size");
LULL_COUNTERS_STATIC_ASSERT(offsetof(struct lull_counters_request, profile_request) == 0,
                            "lull_counters_request layout: profile_request");
LULL_COUNTERS_STATIC_ASSERT(offsetof(struct lull_counters_request, profile_done) == 8,
                            "lull_counters_request layout: profile_done");
LULL_COUNTERS_STATIC_ASSERT(offsetof(struct lull_counters_request, profile_status) == 16,
                            "lull_counters_request layout: profile_status");

#ifdef __cplusplus
}
#endif

#endif
