/* lull: a memory allocator whose request threads never pay for giving
 * memory back to the kernel. Link with -llull (or LD_PRELOAD=liblull.so) and
 * the standard malloc family is lull's; the lull_* names below are always
 * available, also in builds that do not replace malloc. */
#ifndef LULL_H
#define LULL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

#define LULL_VERSION_MAJOR 0
#define LULL_VERSION_MINOR 1
#define LULL_VERSION_PATCH 0
#define LULL_VERSION                                                                               \
    ((LULL_VERSION_MAJOR * 10000) + (LULL_VERSION_MINOR * 100) + LULL_VERSION_PATCH)
#define LULL_VERSION_STRING "0.1.0"

#if defined(__GNUC__)
#define LULL_MALLOC_ATTR __attribute__((malloc, warn_unused_result))
#define LULL_EXPORT __attribute__((visibility("default")))
#else
#define LULL_MALLOC_ATTR
#define LULL_EXPORT
#endif

/* The malloc family. Out of memory: NULL with errno ENOMEM. */
LULL_EXPORT void *lull_malloc(size_t size) LULL_MALLOC_ATTR;
LULL_EXPORT void *lull_calloc(size_t count, size_t size) LULL_MALLOC_ATTR;
LULL_EXPORT void *lull_realloc(void *p, size_t size);
LULL_EXPORT void *lull_reallocarray(void *p, size_t count, size_t size);
LULL_EXPORT void lull_free(void *p);
/* Free with the size that was asked for; lull checks that a request of
 * that size would have been given this block (same size class) and aborts
 * on a mismatch. As C23 has it, free_sized is for blocks of malloc, calloc
 * and realloc; an aligned block (aligned_alloc, posix_memalign, memalign,
 * valloc, pvalloc) is freed with free_aligned_sized and its alignment:
 * free_sized of one aborts when the size alone would give another class
 * (free_sized(valloc(10), 10) does). */
LULL_EXPORT void lull_free_sized(void *p, size_t size);
LULL_EXPORT void lull_free_aligned_sized(void *p, size_t alignment, size_t size);
LULL_EXPORT void *lull_aligned_alloc(size_t alignment, size_t size) LULL_MALLOC_ATTR;
LULL_EXPORT int lull_posix_memalign(void **out, size_t alignment, size_t size);
LULL_EXPORT size_t lull_usable_size(const void *p);
/* Does lull own this pointer (a live or free block of one of its segments
 * or huge mappings)? Asked for a block's start: a pointer inside a huge
 * block past its first 32 MiB segment, or inside a huge block aligned past
 * 32 MiB, reads false (only the segment of a huge block's header is
 * recorded). */
LULL_EXPORT bool lull_owns(const void *p);

LULL_EXPORT const char *lull_version(void);

/* A program that links lull may define
 *     const char *lull_conf = "reclaim_cpu=3,purge_delay_ms=500";
 * read at start before the environment (which wins). */
/* Configuration. Keys as in LULL_CONF (see docs/configuration.md):
 * purge_delay_ms, purge_mode, backend, refault_monitor, reclaim_cpu,
 * reclaim_sched, numa, numa_nodes, counter_page, verbose, strict_checks,
 * warm_reserve_mb, inline_purge, huge_cache_mb, huge_cache_idle_ms,
 * heap_limit_mb, profile_sample_kb, thp. Returns false (after one message
 * on stderr) for an unknown key or a bad value. Keys that shape start-up
 * (backend, reclaim_cpu, reclaim_sched, numa, numa_nodes, counter_page,
 * refault_monitor, profile_sample_kb, thp) are refused once lull has
 * started (before main): set those in lull_conf or the environment. */
LULL_EXPORT bool lull_configure(const char *key, const char *value);
/* The purge delay may change at any time: -1 never purges, 0 purges as soon
 * as the reclaim thread sees a free slice, > 0 waits that many ms, -2 is the
 * adaptive policy; below -2 means never, above a day (86,400,000) a day. */
LULL_EXPORT void lull_set_purge_delay_ms(long ms);
LULL_EXPORT long lull_purge_delay_ms(void);

/* Ask the reclaim thread to run a tick now and wait until it has (for tests
 * and for servers that know they just went idle). Returns false when no
 * reclaim thread runs. */
LULL_EXPORT bool lull_reclaim_now(void);

/* Give every free byte lull holds back to the kernel now, whatever the
 * purge delay (also "never"), and return when it is done: the calling
 * thread's own cached free memory first (lull_thread_collect), then every
 * dirty and MADV_FREE'd free slice, the warm reserve and the pages parked
 * in spans in use (MADV_DONTNEED), and every cached huge mapping
 * (unmapped). Valkey's MEMORY PURGE, jemalloc's arena.<i>.purge. Other
 * threads' cached free memory stays theirs. The reclaim thread does the
 * work; when there is none (it could not start), the caller does. Any
 * thread, any number at once. Leaves errno as it was (a purge the kernel
 * refuses is counted in purge_errors). */
LULL_EXPORT void lull_purge_all(void);

/* Give this thread's cached free memory back to its arena (it stays mapped
 * until the reclaim thread purges it), and send the frees it made into other
 * threads' blocks that it still holds (they go out in batches of 64 per
 * owner thread, or when the thread takes a new span or exits). A
 * thread that frees other threads' blocks and then idles for long may call
 * it before it idles. */
LULL_EXPORT void lull_thread_collect(void);

/* Bind the calling thread's future allocations to a NUMA node (-1: back to
 * its current CPU's node). Returns 0, or a negative errno value: -EINVAL
 * for a node that is not present (the binding is unchanged), -ENOMEM if
 * the thread has no heap and none could be made. errno is not set. On a
 * thread that is exiting (from a thread-specific data destructor that runs
 * after lull's own), the node is checked and recorded but nothing moves:
 * such a thread's allocations come from a heap shared by exiting threads. */
LULL_EXPORT int lull_thread_set_node(int node);

/* Active defragmentation (docs/defrag.md), as Redis and Valkey run it on
 * jemalloc: scan your own pointers in short steps, ask which blocks sit in
 * sparse spans, and move those. A block moves only if its span is not the
 * current span of its class and is not full, and it is used at most 1.125
 * times the average of its class's non-full spans (Redis's rule; for
 * blocks of 256 B to 2 KiB, its page against the class's resident pages:
 * lull gives back the pages of a span in use), and only into the densest
 * span of the class that has a free block. */
typedef struct lull_defrag_info {
    size_t block_size;  /* usable bytes of the block; 0 for a pointer that is not one */
    size_t span_free;   /* free blocks in its span (large and huge: 0) */
    size_t span_total;  /* blocks its span holds (large and huge: 1) */
    size_t class_free;  /* free blocks over the non-full spans of its class in */
    size_t class_total; /* its heap, and the blocks they hold (0 when !owned_by_caller) */
    /* 1: lull_defrag_move() called now by this thread would move it */
    int moved_would_help;
    /* 1: the calling thread's heap owns the block, and every figure is exact;
     * 0: another thread's heap does, whose lists only that thread may walk:
     * the span figures are what its owner last wrote, the class figures are
     * 0, and moved_would_help judges it against the caller's own heap (the
     * heap lull_defrag_move() would move it into) */
    int owned_by_caller;
} lull_defrag_info;

/* Fill out[i] for each of the n pointers. Returns 0; or -1 with errno
 * EINVAL when some pointer is not a block lull handed out (NULL, foreign
 * memory, a block inside no span in use, a block the caller's own heap
 * holds free), whose out[i] is then all zero (the others are filled); never
 * aborts. Nothing is moved or freed. */
LULL_EXPORT int lull_defrag_query(const void *const *ptrs, size_t n, lull_defrag_info *out);
/* Move p if that helps: a new block of the same size class in a denser span
 * (never p's span, never one that defragmentation is emptying), with p's
 * contents, and p freed; else p itself (also for large and huge blocks, and
 * when no block is free there: no span is taken for a move). Never NULL for
 * a valid p; for a pointer lull did not hand out, p with errno EINVAL. Any
 * thread that may free p may call it: a block of another thread's heap
 * moves into the caller's heap, and its old block is freed to its owner
 * like any remote free. */
LULL_EXPORT void *lull_defrag_move(void *p);

/* Sampled heap profile (profile_sample_kb, docs/heap-profile.md): write
 * the samples kept so far to `path` as a gzip-compressed pprof
 * profile.proto with the sample types alloc_objects, alloc_space,
 * inuse_objects, inuse_space (the default), peak_objects and peak_space,
 * each an unbiased estimate of the real figure. The profile is written
 * into a new file next to path (.lull-profile-XXXXXX, mode 0600), renamed
 * over path once whole: path is never opened, so a dump that fails leaves
 * what path held, and a link there (hard or symbolic) is replaced, never
 * written through. 0 on success; -1 with errno: EINVAL when profiling is
 * off (or path is NULL), or the error of creating, writing or renaming
 * the file (which is then removed). */
LULL_EXPORT int lull_profile_dump(const char *path);

/* In-process statistics; see lull/counters.h for the meaning of each field. */
struct lull_counters;
LULL_EXPORT int lull_stats(struct lull_counters *out);
/* A readable summary, like malloc_stats(), to fd (2 if fd < 0). */
LULL_EXPORT void lull_print_stats(int fd);

/* glibc's <malloc.h> calls, answered from lull's heap. Builds that replace
 * malloc (LULL_OVERRIDE, the default) export them under glibc's names
 * too: malloc_trim, mallinfo2, mallinfo, malloc_stats (lull_print_stats(2))
 * and malloc_info, in liblull.so and liblull.a alike.
 *
 * lull_malloc_trim (malloc_trim): give every free byte back now, as
 * lull_purge_all() (the reclaim thread purges; the caller waits). Returns 1
 * if memory went back to the kernel during the call (purged or unmapped,
 * also by the reclaim thread's own tick meanwhile), else 0. `pad` is
 * ignored: glibc keeps pad bytes at the top of its heap, and lull's heap
 * has no top (32 MiB segments and huge mappings); the free memory it
 * keeps ready is the warm reserve (warm_reserve_mb), drained here too. */
LULL_EXPORT int lull_malloc_trim(size_t pad);

/* glibc's struct mallinfo2, field for field, filled from the accounting
 * identity (lull/counters.h). It counts memory that may be resident (the
 * purged term is in no field), so arena shrinks when lull gives memory
 * back; arena == uordblks + fordblks always, and hblkhd is apart. */
struct lull_mallinfo2 {
    size_t arena;    /* bytes lull holds outside live huge blocks, but purged ones */
    size_t ordblks;  /* 0: lull keeps no list of free chunks to count */
    size_t smblks;   /* 0: no fastbins */
    size_t hblks;    /* live huge blocks (over 16 MiB, a mapping each) */
    size_t hblkhd;   /* their bytes: blocks and header slices */
    size_t usmblks;  /* 0, as in glibc */
    size_t fsmblks;  /* 0: no fastbins */
    size_t uordblks; /* in use: live small and large blocks (usable size), size-class
                      * rounding and span tails, lull's metadata */
    size_t fordblks; /* free and resident: free blocks of spans in use, dirty free
                      * slices, slices being purged, the warm reserve */
    size_t keepcost; /* what lull_malloc_trim() gives back of fordblks: all but the
                      * free blocks of spans in use (dirty, purging, warm) */
};
/* mallinfo2(); mallinfo() has the same figures as int, each saturated at
 * INT_MAX (glibc's wraps past 2 GiB). Walks every segment, as lull_stats()
 * does, but never starts the reclaim thread. */
LULL_EXPORT struct lull_mallinfo2 lull_mallinfo2(void);

/* malloc_info(): an XML document on fp, <malloc version="1"> with a <heap>
 * per NUMA node (its identity terms) and glibc's totals (<total
 * type="rest"> free, <total type="mmap"> the huge blocks, <system
 * type="current"> resident, <aspace type="total"> mapped), then the
 * mallinfo2 figures and the identity (docs/architecture.md, "glibc's malloc
 * calls"). 0; EINVAL (with errno EINVAL) if options is not 0 or fp is
 * NULL, as glibc returns it; -1 if fp is in error after the writes. */
LULL_EXPORT int lull_malloc_info(int options, FILE *fp);

#ifdef __cplusplus
}
#endif
#endif
