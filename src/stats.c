/* Statistics gathering; see stats.h. */
#include "src/stats.h"
#include "numa/thp.h"
#include "lull.h"
#include "numa/arena.h"
#include "numa/page_park.h"
#include "numa/slice_state.h"
#include "numa/span_table.h"
#include "reclaim/huge_cache.h"
#include "reclaim/purge_backend.h"
#include "reclaim/reclaim.h"
#include "reclaim/refault.h"
#include "base/config.h"
#include "src/alloc.h"
#include "src/heap.h"
#include "src/init.h"
#include "numa/huge.h"
#include "base/message.h"
#include "base/resident.h"

#include <stdio.h>
#include <string.h>
#include <unistd.h>

extern _Atomic uint64_t lull_heap_chunk_bytes, lull_heap_used_bytes;
extern _Atomic uint64_t lull_os_slack_bytes;
const purge_backend *lull_reclaim_backend(void);

/* The walker reads span descriptors and heap counters that their owner
 * threads write with plain stores on the malloc and free paths. Each value
 * is an aligned word read with a relaxed atomic load: it may be stale, and
 * every use is clamped to what the slice maps allow. ThreadSanitizer is
 * told to skip these reads, and only these (the maps, the huge-block terms
 * and the reclaim figures are atomic on both sides). */
#if defined(__SANITIZE_THREAD__)
#define LULL_STATS_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define LULL_STATS_TSAN 1
#endif
#endif
#ifdef LULL_STATS_TSAN
void AnnotateIgnoreReadsBegin(const char *file, int line);
void AnnotateIgnoreReadsEnd(const char *file, int line);
#define RACY_READS_BEGIN() AnnotateIgnoreReadsBegin(__FILE__, __LINE__)
#define RACY_READS_END() AnnotateIgnoreReadsEnd(__FILE__, __LINE__)
#else
#define RACY_READS_BEGIN() ((void)0)
#define RACY_READS_END() ((void)0)
#endif

static void account_segment(lull_segment *s, struct lull_counters_accounting *a) {
    uint64_t free_map[LULL_SLICE_WORDS];
    a->mapped += LULL_SEGMENT_SIZE;
    a->metadata += (uint64_t)LULL_META_SLICES * LULL_SLICE_SIZE;
    /* free slices by state; a slice in two maps for an instant (a purge
     * finishing) is counted once, in the first state that has it */
    for (unsigned w = 0; w < LULL_SLICE_WORDS; w++) {
        lull_slice_word x;
        lull_slices_word(s, w, &x);
        uint64_t seen = 0;
        const struct {
            uint64_t bits;
            uint64_t *term;
        } states[] = {{x.purging, &a->purging},
                      {x.dirty, &a->dirty},
                      {x.warm, &a->warm},
                      {x.clean, &a->purged}};
        for (unsigned k = 0; k < sizeof states / sizeof states[0]; k++) {
            uint64_t bits = states[k].bits & ~seen;
            seen |= bits;
            *states[k].term += (uint64_t)__builtin_popcountll(bits) * LULL_SLICE_SIZE;
        }
        free_map[w] = seen;
    }
    /* in-use slices: walk the spans */
    RACY_READS_BEGIN();
    for (unsigned i = LULL_META_SLICES; i < LULL_SLICES;) {
        if (free_map[i / 64] >> (i % 64) & 1) {
            i++;
            continue;
        }
        lull_span *d = &lull_span_table_of(s)->slices[i];
        uint8_t kind = __atomic_load_n(&d->kind, __ATOMIC_ACQUIRE);
        unsigned n = __atomic_load_n(&d->slice_count, __ATOMIC_RELAXED);
        /* the span's slices that really are in use (a span being set up or
         * torn down right now may disagree with the maps) */
        unsigned run = 0;
        while (run < n && i + run < LULL_SLICES &&
               !(free_map[(i + run) / 64] >> ((i + run) % 64) & 1))
            run++;
        uint64_t bytes = (uint64_t)(run ? run : 1) << LULL_SLICE_SHIFT;
        if (kind == LULL_SPAN_SMALL && run == n) {
            uint64_t bs = __atomic_load_n(&d->block_size, __ATOMIC_RELAXED);
            uint64_t cap = __atomic_load_n(&d->capacity, __ATOMIC_RELAXED);
            uint64_t used = (__atomic_load_n(&d->used, __ATOMIC_RELAXED) & ~LULL_SPAN_SLOW_FREE) +
                            __atomic_load_n(&d->park_at, __ATOMIC_RELAXED);
            if (cap * bs > bytes) cap = bytes / (bs ? bs : 1);
            if (used > cap) used = cap;
            /* parked pages the reclaim thread purged (or is purging) hold
             * free blocks only, or the tail past the last block: purged,
             * not span_free or rounding, every byte of them, as the
             * resident estimate counts them (base/resident.h) */
            uint64_t free_bytes = (cap - used) * bs, tail = bytes - cap * bs;
            uint64_t purged = lull_pages_purged_bytes(s, i, n);
            uint64_t purged_tail = lull_pages_purged_bytes_from(s, i, n, cap * bs);
            if (purged_tail > tail) purged_tail = tail;
            uint64_t purged_blocks = purged > purged_tail ? purged - purged_tail : 0;
            if (purged_blocks > free_bytes) purged_blocks = free_bytes; /* racy reads */
            a->live += used * bs;
            a->span_free += free_bytes - purged_blocks;
            a->purged += purged_blocks + purged_tail;
            a->rounding += tail - purged_tail;
        } else if (kind == LULL_SPAN_LARGE && run == n) {
            uint64_t off = __atomic_load_n(&d->block_offset, __ATOMIC_RELAXED);
            if (off > bytes) off = 0;
            a->live += bytes - off;
            a->rounding += off;
        } else {
            a->span_free += bytes; /* mid-transition: neither live nor free yet */
        }
        i += run ? run : 1;
    }
    RACY_READS_END();
}

static void add_acct(struct lull_counters_accounting *to,
                     const struct lull_counters_accounting *a) {
    to->mapped += a->mapped;
    to->live += a->live;
    to->rounding += a->rounding;
    to->span_free += a->span_free;
    to->dirty += a->dirty;
    to->purging += a->purging;
    to->purged += a->purged;
    to->warm += a->warm;
    to->metadata += a->metadata;
}

static void count_heap_stats(lull_heap *h, void *arg) {
    struct lull_counters *out = arg;
    RACY_READS_BEGIN();
    out->malloc_count += __atomic_load_n(&h->allocs, __ATOMIC_RELAXED);
    out->free_count += __atomic_load_n(&h->frees, __ATOMIC_RELAXED);
    RACY_READS_END();
}

/* The identity's terms, per node and in total, added into out (zeroed);
 * and, when huge is not NULL, the live huge blocks' terms they hold. */
static void account(struct lull_counters *out, lull_stats_huge *huge) {
    int nodes = lull_arena_count;
    out->node_count = (uint64_t)nodes;
    /* cached huge mappings: one word each, read once (reclaim/huge_cache.h) */
    uint64_t c_dirty[LULL_MAX_NODES] = {0}, c_purging[LULL_MAX_NODES] = {0},
             c_purged[LULL_MAX_NODES] = {0}, c_meta[LULL_MAX_NODES] = {0},
             c_bytes[LULL_MAX_NODES] = {0};
    lull_huge_cache_account(c_dirty, c_purging, c_purged, c_meta, c_bytes);
    for (int n = 0; n < nodes; n++) {
        struct lull_counters_node *node = &out->nodes[n];
        node->node_id = (uint64_t)lull_arenas[n].node;
        for (lull_segment *s = atomic_load_explicit(&lull_arenas[n].segments, memory_order_acquire);
             s; s = s->next)
            account_segment(s, &node->acct);
        /* huge blocks: read `mapped` last, so terms are never larger */
        lull_huge_accounting *h = &lull_huge_acct[n];
        uint64_t live = atomic_load(&h->live), meta = atomic_load(&h->metadata);
        uint64_t slack = atomic_load(&h->slack), freed = atomic_load(&h->freed);
        if (huge) {
            huge->blocks += meta / LULL_HUGE_HEADER_BYTES; /* one header a live block */
            huge->live += live;
            huge->metadata += meta;
        }
        node->acct.mapped += live + meta + slack + freed;
        node->acct.live += live;
        node->acct.metadata += meta;
        node->acct.purged += slack;
        node->acct.dirty += freed;
        node->acct.mapped += c_bytes[n];
        node->acct.dirty += c_dirty[n];
        node->acct.purging += c_purging[n];
        node->acct.purged += c_purged[n];
        node->acct.metadata += c_meta[n];
        node->huge_cache_bytes = c_bytes[n];
        node->huge_cache_hits = atomic_load_explicit(&h->reused, memory_order_relaxed);
        node->huge_cache_misses = atomic_load_explicit(&h->fresh, memory_order_relaxed);
    }
    /* heap chunks: the heaps handed out, and the rest never touched (read
     * first: it is never larger than the chunks) */
    uint64_t heap_used = atomic_load(&lull_heap_used_bytes);
    uint64_t heap_bytes = atomic_load(&lull_heap_chunk_bytes);
    if (heap_used > heap_bytes) heap_used = heap_bytes;
    out->nodes[0].acct.mapped += heap_bytes;
    out->nodes[0].acct.metadata += heap_used;
    out->nodes[0].acct.purged += heap_bytes - heap_used;
    uint64_t slack = atomic_load(&lull_os_slack_bytes); /* alignment slack: mapped, untouched */
    out->nodes[0].acct.mapped += slack;
    out->nodes[0].acct.purged += slack;
    for (int n = 0; n < nodes; n++)
        add_acct(&out->total, &out->nodes[n].acct);
}

void lull_stats_collect(struct lull_counters *out) {
    memset(out, 0, sizeof *out);
    out->page_size = LULL_PAGE_SIZE;
    account(out, NULL);

    lull_reclaim_stats r;
    lull_reclaim_get_stats(&r);
    /* NULL until the reclaim thread has opened its backend */
    const purge_backend *b = lull_reclaim_backend();
    /* the backend may have degraded at run time: read it now */
    if (b) r.backend = (int)__atomic_load_n(&b->kind, __ATOMIC_RELAXED);
    if (r.running) out->flags |= LULL_COUNTERS_F_RECLAIM_THREAD;
    if ((b && __atomic_load_n(&b->fallback_reason[0], __ATOMIC_RELAXED)) || r.start_failed)
        out->flags |= LULL_COUNTERS_F_DEGRADED;
    if (!r.running && __atomic_load_n(&lull_config.inline_purge, __ATOMIC_RELAXED))
        out->flags |= LULL_COUNTERS_F_INLINE_PURGE;
    long delay = lull_reclaim_effective_delay();
    out->purge_delay_ms = delay < 0 ? LULL_COUNTERS_DELAY_NEVER : (uint64_t)delay;
    out->backend = r.running && delay >= 0 ? (uint64_t)r.backend : LULL_COUNTERS_BACKEND_NONE;
    out->purge_mode = delay < 0                  ? LULL_COUNTERS_PURGE_NONE
                      : r.mode == LULL_MODE_FREE ? LULL_COUNTERS_PURGE_FREE
                                                 : LULL_COUNTERS_PURGE_DONTNEED;
    out->reclaim_cpu_ns = r.cpu_ns;
    out->reclaim_ticks = r.ticks;
    out->huge_unmapped = r.huge_freed;
    out->huge_unmapped_bytes = r.huge_freed_bytes;
    /* purges made on a caller's own backend (no reclaim thread): madvise */
    out->purge_calls[LULL_COUNTERS_BACKEND_MADVISE] = r.caller_purge_ranges;
    out->purge_bytes[LULL_COUNTERS_BACKEND_MADVISE] = r.caller_purge_bytes;
    out->purge_syscalls[LULL_COUNTERS_BACKEND_MADVISE] = r.caller_purge_calls;
    for (int k = 1; k < LULL_COUNTERS_BACKEND_COUNT && k < PURGE_KIND_COUNT; k++) {
        if (b) {
            out->purge_calls[k] += purge_backend_counter(&b->per_kind[k].ranges);
            out->purge_bytes[k] += purge_backend_counter(&b->per_kind[k].bytes);
            out->purge_syscalls[k] += purge_backend_counter(&b->per_kind[k].calls);
        }
        out->purged_pages += out->purge_bytes[k] / LULL_PAGE_SIZE;
    }
    /* each refused range once: the backend that made the purge counts it
     * (r.purge_failures counts the same refusals again, by run) */
    out->purge_errors = (b ? purge_backend_counter(&b->errors) : 0) + r.caller_purge_errors;
    out->backend_fallbacks = b ? purge_backend_counter(&b->fallbacks) : 0;
    /* the refault monitor is the reclaim thread's to set up: read its state
     * once the thread has started it (or when no thread will) */
    if (b || r.start_failed) out->refault_mechanism = lull_refault_fill_counters(out);
    lull_heaps_foreach(count_heap_stats, out);
    out->free_count += atomic_load_explicit(&lull_other_frees, memory_order_relaxed);
    out->malloc_count += atomic_load_explicit(&lull_other_allocs, memory_order_relaxed);
    lull_config_format(out->config, sizeof out->config);
    lull_thp_counters t;
    lull_thp_read(&t);
    lull_thp_state st = lull_thp_state_now();
    out->thp = (struct lull_counters_thp){
        .state = st == LULL_THP_ON            ? LULL_COUNTERS_THP_ON
                 : st == LULL_THP_UNAVAILABLE ? LULL_COUNTERS_THP_UNAVAILABLE
                                              : LULL_COUNTERS_THP_OFF,
        .huge_bytes = t.huge_bytes,
        .collapses = t.collapses,
        .collapse_failures = t.collapse_failures,
        .splits = t.splits,
        .whole_purges = t.whole_purges,
        .held_bytes = t.held_bytes,
        .held_regions = t.held_regions,
        .prefaulted_regions = t.prefaulted_regions,
    };
}

/* the caller's last free counts as done (src/alloc.h, the deferred free):
 * a program that frees and then reads its counters sees it */
static void settle_own_free(void) {
    lull_ensure_init();
    if (lull_tl_heap != &lull_heap_empty) lull_heap_free_deferred(lull_tl_heap);
}

void lull_stats_memory(struct lull_counters *out, lull_stats_huge *huge) {
    settle_own_free();
    memset(out, 0, sizeof *out);
    out->page_size = LULL_PAGE_SIZE;
    memset(huge, 0, sizeof *huge);
    account(out, huge);
}

uint64_t lull_stats_given_back(void) {
    lull_reclaim_stats r;
    lull_reclaim_get_stats(&r);
    const purge_backend *b = lull_reclaim_backend();
    /* what the counter page reports as purge_bytes[] and huge_unmapped_bytes */
    uint64_t bytes = r.caller_purge_bytes + r.huge_freed_bytes;
    for (int k = 1; b && k < PURGE_KIND_COUNT; k++)
        bytes += purge_backend_counter(&b->per_kind[k].bytes);
    return bytes;
}

LULL_EXPORT int lull_stats(struct lull_counters *out) {
    if (!out) return -1;
    settle_own_free();
    lull_stats_collect(out);
    out->magic = LULL_COUNTERS_MAGIC;
    out->abi_version = LULL_COUNTERS_ABI_VERSION;
    out->size = sizeof *out;
    out->pid = (uint64_t)getpid();
    return 0;
}

LULL_EXPORT void lull_print_stats(int fd) {
    struct lull_counters c;
    lull_stats(&c);
    if (fd < 0) fd = 2;
    const struct lull_counters_accounting *a = &c.total;
    uint64_t cache = 0, hits = 0, misses = 0;
    for (uint64_t n = 0; n < c.node_count && n < LULL_COUNTERS_MAX_NODES; n++) {
        cache += c.nodes[n].huge_cache_bytes;
        hits += c.nodes[n].huge_cache_hits;
        misses += c.nodes[n].huge_cache_misses;
    }
    dprintf(fd,
            "lull %s: mapped %llu KiB = live %llu + rounding %llu + span_free %llu + dirty %llu + "
            "purging %llu + purged %llu + warm %llu + metadata %llu KiB (%s)\n",
            LULL_VERSION_STRING, (unsigned long long)a->mapped >> 10,
            (unsigned long long)a->live >> 10, (unsigned long long)a->rounding >> 10,
            (unsigned long long)a->span_free >> 10, (unsigned long long)a->dirty >> 10,
            (unsigned long long)a->purging >> 10, (unsigned long long)a->purged >> 10,
            (unsigned long long)a->warm >> 10, (unsigned long long)a->metadata >> 10,
            lull_counters_accounting_sum(a) == a->mapped ? "identity holds" : "IDENTITY BROKEN");
    dprintf(fd,
            "lull: reclaim %s, backend %s, purge delay %lld ms, mode %s, %llu ticks, %llu us cpu, "
            "purged %llu KiB, huge unmapped %llu, huge cache %llu KiB (%llu hits, %llu misses)\n",
            c.flags & LULL_COUNTERS_F_RECLAIM_THREAD ? "running" : "not running",
            lull_counters_backend_name(c.backend),
            c.purge_delay_ms == LULL_COUNTERS_DELAY_NEVER ? -1LL : (long long)c.purge_delay_ms,
            lull_counters_purge_mode_name(c.purge_mode), (unsigned long long)c.reclaim_ticks,
            (unsigned long long)c.reclaim_cpu_ns / 1000,
            (unsigned long long)(c.purge_bytes[1] + c.purge_bytes[2] + c.purge_bytes[3]) >> 10,
            (unsigned long long)c.huge_unmapped, (unsigned long long)cache >> 10,
            (unsigned long long)hits, (unsigned long long)misses);
    uint64_t limit = lull_resident_limit();
    char limit_text[32] = "none";
    if (limit) snprintf(limit_text, sizeof limit_text, "%llu KiB", (unsigned long long)limit >> 10);
    dprintf(fd, "lull: heap limit %s, resident %llu KiB, %llu allocations refused for the limit\n",
            limit_text, (unsigned long long)lull_resident_bytes() >> 10,
            (unsigned long long)lull_resident_refusals());
    dprintf(fd, "lull: config %s\n", c.config);
}
