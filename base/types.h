/* The structures the allocator's folders share, and the constants of its
 * layout (the parts of a segment's metadata are their modules': see the
 * table above lull_segment).
 *
 * Layout: memory comes in segments of 32 MiB aligned to 32 MiB, so the
 * segment of any block is its address with the low bits masked off. A
 * segment is 512 slices of 64 KiB; slices 0 and 1 hold the segment's
 * metadata, the others are handed out as spans. A span is a run of
 * slices that holds blocks of one size class (small) or one block (large).
 * Blocks carry no header: the slice index finds the span descriptor, which
 * knows the block size. Blocks over LULL_LARGE_MAX live in a mapping of their
 * own (huge), whose first page is a lull_huge header at a 32 MiB boundary. */
#ifndef LULL_TYPES_H
#define LULL_TYPES_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define LULL_SEGMENT_SHIFT 25
#define LULL_SEGMENT_SIZE ((size_t)1 << LULL_SEGMENT_SHIFT)
#define LULL_SEGMENT_MASK (LULL_SEGMENT_SIZE - 1)
#define LULL_SLICE_SHIFT 16
#define LULL_SLICE_SIZE ((size_t)1 << LULL_SLICE_SHIFT)
#define LULL_SLICES (LULL_SEGMENT_SIZE / LULL_SLICE_SIZE) /* 512 */
#define LULL_SLICE_WORDS (LULL_SLICES / 64)
#define LULL_META_SLICES 2 /* the segment's metadata: span descriptors are 64 KiB */
#define LULL_PAGE_SIZE ((size_t)4096)
/* n rounded up to whole pages */
#define LULL_PAGES_OF(n) (((size_t)(n) + LULL_PAGE_SIZE - 1) & ~(LULL_PAGE_SIZE - 1))
#define LULL_PAGES_PER_SLICE (LULL_SLICE_SIZE / LULL_PAGE_SIZE) /* 16: 2 bits each in a word */
#define LULL_EXTENT_SLICES 32 /* 2 MiB: the unit a purge keeps whole */
/* a slice's row of parking metadata: the 112-byte class's bitmap (585
 * blocks: 80 bytes) and its 16 pages' counts */
#define LULL_PARK_META_BYTES 96

#define LULL_SMALL_MAX ((size_t)512 * 1024) /* largest size class */
#define LULL_LARGE_MAX ((size_t)16 << 20)   /* largest one-block span */
#define LULL_MAX_ALLOC ((size_t)1 << 46)
#define LULL_MAX_NODES 8

typedef struct lull_block {
    uintptr_t next_encoded; /* next free block, safe-linked (see span.h) */
} lull_block;

/* bit 31 of a span's used: every free into the span takes the slow path
 * (it is on its heap's full list, or has parked pages) */
#define LULL_SPAN_SLOW_FREE 0x80000000u

typedef enum {
    LULL_SPAN_NONE = 0, /* slice is not the head of a span in use */
    LULL_SPAN_SMALL,    /* blocks of one size class, owned by a heap */
    LULL_SPAN_LARGE,    /* one block */
} lull_span_kind;

struct lull_heap;
struct lull_arena;

/* Span descriptor: slices[i] of the segment's span table (numa/span_table.h)
 * describes the span whose head is slice i; the table's span_head leads
 * from any slice of a span to its head.
 *
 * 128 bytes, two lines in a line-aligned array. The first holds what every
 * free() reads to find the owner and check the pointer, written only when
 * the span is set up: a thread freeing into another heap's span reads it
 * from a line the owner does not write, which stays shared in both caches.
 * The second holds what the owner's malloc and free write. In one line of
 * 64 bytes (96-byte descriptors), the remote free's read of `heap` missed
 * every time the owner had allocated from the span meanwhile: 47 % of
 * free()'s samples in bench_throughput --mode larson-live. Each line is the
 * span's alone: two threads' spans never share a line either (before the
 * array was line-aligned, two threads allocating in neighbouring spans ran
 * at 154-163 instead of 205-218 Mops/s, bench_throughput --mode mt). */
typedef struct lull_span {
    /* ---- read-mostly: set when the span is taken ---- */
    struct lull_heap *_Atomic heap; /* owner (small); NULL for large */
    union {
        size_t requested;   /* large: bytes asked for (accounting) */
        uint64_t div_magic; /* small: ceil(2^64 / block_size), see lull_block_misaligned */
    };
    /* small: the address of the span's first byte times div_magic (mod
     * 2^64), so that lull_block_misaligned needs no offset in the segment */
    uint64_t start_magic;
    uint32_t block_size;
    uint32_t capacity;     /* blocks that fit in the span */
    uint32_t block_offset; /* large: offset of the block in the span (alignment) */
    uint16_t slice_count;
    uint8_t kind; /* lull_span_kind */
    uint8_t size_class;
    uint8_t zeroed; /* uncarved memory is known to be zero */
    /* `parking` (below) where a remote free looks, in the line it loads
     * anyway: while set, its double-free check asks whether the block lies
     * on a page given back (a purged block's word is 0, which does not look
     * free). Written by the owner at a park's start and end only. */
    _Atomic uint8_t parks;
    /* ---- the owner's: malloc and free write these ---- */
    _Alignas(64) lull_block *free; /* local free list: malloc pops, local free pushes */
    /* blocks handed out and not freed locally, less park_at;
     * LULL_SPAN_SLOW_FREE set while the span is on its heap's full list or
     * has parked pages, so that free() tests all three with one signed
     * compare */
    uint32_t used;
    uint32_t carved;        /* blocks carved so far (the rest never touched) */
    struct lull_span *next; /* heap queue links */
    struct lull_span *prev;
    /* Frees from threads without a heap, and of blocks too small for a
     * message (src/outbox.h): the head of their list, with
     * LULL_REMOTE_QUEUED in bit 0 while the span is on (or being pushed onto)
     * its owner's remote_spans stack. One word, so that no thread can see
     * "no remote free and not queued" while a remote free is half done
     * (docs/architecture.md, the remote-free protocol). */
    _Atomic uintptr_t thread_free;
    struct lull_span *remote_next;
    uint8_t kept;    /* 1 + slot in its heap's kept ring, or 0 (heap.c) */
    uint8_t in_full; /* on its heap's full list */
    /* set by a remote free whose block already looked free: the owner's
     * collection then checks the list against its local free list */
    _Atomic uint8_t remote_suspect;
    /* Parked pages (src/span_park.c): `used` counts down to park_at, so
     * the free that brings the span to it takes the slow path and starts
     * parking; lull_span_used() is used plus park_at. 0: none due (always
     * for a kept span). */
    uint32_t park_at;
    uint16_t parked_pages; /* pages of the span not NONE in page_state */
    /* parking: the free list is dissolved into the span's free bitmap and
     * page live counts (its segment's parking rows, src/span_park.c) */
    uint16_t parking; /* 1 while parking */
    /* large: the block is a heap profile sample (src/profile.h), which
     * its free forgets */
    uint8_t sampled;
} lull_span;

_Static_assert(sizeof(lull_span) == 128, "the two-line layout above assumes 128 bytes");
_Static_assert(offsetof(lull_span, free) == 64, "what free() reads fills the first line");

#define LULL_REMOTE_QUEUED ((uintptr_t)1)

#define LULL_SEGMENT_MAGIC 0x6c756c6c5345474dULL /* "lullSEGM" */
#define LULL_HUGE_MAGIC 0x6c756c6c48554745ULL    /* "lullHUGE" */

/* The segment's metadata, its first LULL_META_SLICES slices: the header
 * (lull_segment, below), then one part for each module that keeps
 * something per slice, at the fixed offsets of this table. Each part's
 * struct is declared by the module that writes it, which checks with
 * LULL_META_PART_CHECK that the struct fits the bytes reserved for it here,
 * and gives the accessor that other modules read it through. A table, not
 * one struct of every part: base/ cannot name numa/'s, reclaim/'s or src/'s
 * types (the folders depend one way: tools/module_cycles.py), and an
 * accessor at a constant offset compiles to the same code as a field of
 * one struct. Fresh segment memory is zero, and every part reads zero as
 * its first state. Each part starts on a cache line of its own. */
#define LULL_META_HEADER_BYTES 64
/* numa/slice_state.h: the slice-state maps, a bit a slice in each of five */
#define LULL_META_SLICE_MAPS_AT LULL_META_HEADER_BYTES
#define LULL_META_SLICE_MAPS_BYTES (5 * LULL_SLICE_WORDS * sizeof(uint64_t))
/* numa/slice_history.h: when each slice was freed and purged (a 32-bit
 * time each), and which were taken again after a purge (a bit each) */
#define LULL_META_SLICE_HISTORY_AT (LULL_META_SLICE_MAPS_AT + LULL_META_SLICE_MAPS_BYTES)
#define LULL_META_SLICE_HISTORY_BYTES                                                              \
    (2 * LULL_SLICES * sizeof(uint32_t) + LULL_SLICE_WORDS * sizeof(uint64_t))
/* reclaim/refault.c: whether the refault monitor registered the segment */
#define LULL_META_REFAULT_AT (LULL_META_SLICE_HISTORY_AT + LULL_META_SLICE_HISTORY_BYTES)
#define LULL_META_REFAULT_BYTES 64
/* numa/parked_pages.h: the page states of in-use spans (a word a slice), the
 * slices with a parked page (a bit each), when each last parked one */
#define LULL_META_PARKED_PAGES_AT (LULL_META_REFAULT_AT + LULL_META_REFAULT_BYTES)
#define LULL_META_PARKED_PAGES_BYTES                                                               \
    (2 * LULL_SLICES * sizeof(uint32_t) + LULL_SLICE_WORDS * sizeof(uint64_t))
/* numa/thp.h: which 2 MiB regions are huge pages */
#define LULL_META_THP_AT (LULL_META_PARKED_PAGES_AT + LULL_META_PARKED_PAGES_BYTES)
#define LULL_META_THP_BYTES 64
/* src/span_park.c: each slice's row of parking metadata */
#define LULL_META_PARK_ROWS_AT (LULL_META_THP_AT + LULL_META_THP_BYTES)
#define LULL_META_PARK_ROWS_BYTES (LULL_SLICES * LULL_PARK_META_BYTES)
/* numa/span_table.h: which span covers each slice (16 bits a slice), and
 * the span descriptors. Last, and no further than LULL_SLICE_SIZE up to
 * descriptor 0 included: a huge block's mapping has only its first slice
 * for a header (span_table.h says why) */
#define LULL_META_SPAN_TABLE_AT (LULL_META_PARK_ROWS_AT + LULL_META_PARK_ROWS_BYTES)
#define LULL_META_SPAN_TABLE_BYTES (LULL_SLICES * (sizeof(uint16_t) + sizeof(lull_span)))
#define LULL_META_END (LULL_META_SPAN_TABLE_AT + LULL_META_SPAN_TABLE_BYTES)

_Static_assert(LULL_META_END <= LULL_META_SLICES * LULL_SLICE_SIZE,
               "segment metadata must fit in its metadata slices");
_Static_assert(LULL_META_SLICE_HISTORY_AT % 64 == 0 && LULL_META_REFAULT_AT % 64 == 0 &&
                   LULL_META_PARKED_PAGES_AT % 64 == 0 && LULL_META_THP_AT % 64 == 0 &&
                   LULL_META_PARK_ROWS_AT % 64 == 0 && LULL_META_SPAN_TABLE_AT % 64 == 0,
               "each part starts on a cache line");

/* In the module that owns part `part` (LULL_META_<part>_AT and _BYTES
 * above), of struct type `type`: the struct fits, aligned. */
#define LULL_META_PART_CHECK(type, part)                                                           \
    _Static_assert(sizeof(type) <= LULL_META_##part##_BYTES &&                                     \
                       LULL_META_##part##_AT % _Alignof(type) == 0,                                \
                   #type " fits its place in the segment's metadata (base/types.h)")

/* The segment's header: the rest of its metadata is its modules' parts,
 * at the offsets above. */
typedef struct lull_segment {
    uint64_t magic;
    struct lull_arena *arena;
    struct lull_segment *next; /* arena's list */
    int node;
    uint32_t index; /* creation order in the arena */
    /* the reclaim thread made the metadata's pages resident (or tried:
     * lull_arena_populate_metadata) */
    _Atomic uint8_t meta_populated;
} lull_segment;
_Static_assert(sizeof(lull_segment) <= LULL_META_HEADER_BYTES, "the header before the parts");

/* The part of s at offset `at` (LULL_META_*_AT): for the accessor of the
 * module that owns it. */
static inline void *lull_segment_part(const lull_segment *s, size_t at) {
    return (char *)s + at;
}

/* A huge block's mapping starts with this header, at a 32 MiB boundary. */
typedef struct lull_huge {
    uint64_t magic;
    void *map_base; /* what mmap returned */
    size_t map_len;
    size_t size;           /* bytes asked for */
    size_t usable;         /* bytes from the block to the end of the mapping */
    uint32_t block_offset; /* from the header */
    int node;
    _Atomic int freed;
    /* ms from its last free to its last reuse from the cache, or
     * LULL_HUGE_NO_GAP (reclaim/huge_word.h, lull_huge_hold_ms) */
    uint32_t reuse_gap_ms;
    struct lull_huge *next; /* reclaim queue link */
} lull_huge;

#define LULL_HUGE_NO_GAP UINT32_MAX

/* A span queue: doubly linked, head is where malloc looks first. */
typedef struct lull_span_queue {
    lull_span *head, *tail;
    uint32_t count; /* spans on it */
} lull_span_queue;

#define LULL_CLASSES 112
#define LULL_KEPT_SLOTS 16

/* A thread heap. Only its owner touches it, except remote_spans, which
 * other threads push to. Heaps are never freed: a dying thread's heap is
 * abandoned and adopted whole by the next new thread; while it waits, the
 * reclaim thread collects its remote frees (holding the registry lock, which
 * makes it the owner for that time). */
#define LULL_DIRECT_WORDS 129 /* (size + 7) >> 3 for sizes up to 1 KiB */

/* Remote frees a heap's thread made and has not sent yet, one message per
 * owner heap (src/outbox.c): blocks linked through their second word. */
#define LULL_OUTBOX_SLOTS 8
typedef struct lull_outbox_slot {
    struct lull_heap *dest; /* the heap that owns every block of the message */
    lull_block *head, *tail;
    uint32_t count; /* blocks */
    uint32_t bytes;
} lull_outbox_slot;

/* What src/defrag.c knows of one size class of a heap: the non-full spans
 * (the class's queue), the blocks in use in them and their resident pages
 * (touched and not parked), and the spans blocks move to (the densest with
 * a free block). Valid while `epoch` is its heap's defrag_epoch, which
 * moves on whenever the heap allocated or freed behind defrag's back.
 * Owner only. */
#define LULL_DEFRAG_TARGETS 4
typedef struct lull_defrag_view {
    /* the densest spans with a free block at the walk, densest first: the
     * next is taken when the first runs out, without a walk */
    struct lull_span *target[LULL_DEFRAG_TARGETS];
    uint32_t target_used[LULL_DEFRAG_TARGETS]; /* their blocks in use at the walk */
    uint64_t used;
    uint64_t pages;
    uint32_t spans;
    uint32_t epoch; /* 0: never valid */
} lull_defrag_view;

typedef struct lull_heap {
    /* fast path of malloc(size <= 1 KiB): direct[(size + 7) >> 3] is
     * current[class of size], so malloc needs no class lookup (2 instructions
     * fewer, callgrind); kept in step by lull_heap_set_current */
    lull_span *direct[LULL_DIRECT_WORDS];
    lull_span *current[LULL_CLASSES]; /* first span of each class */
    lull_span_queue queue[LULL_CLASSES];
    lull_span_queue full; /* spans with no free block */
    struct lull_arena *arena;
    struct lull_heap *next_all; /* registry of every heap */
    struct lull_heap *next_abandoned;
    /* for a debugger only: the thread that took it (0 abandoned, -2 the
     * late heap); a fork child keeps the parent's (src/heap.c) */
    pid_t owner_tid;
    int node;
    bool node_pinned; /* lull_thread_set_node() */
    /* on the abandoned list, or the late heap (heap.c): its empty spans go
     * back to the arena at once, none is kept for a thread that is gone */
    bool abandoned;
    /* an empty span stayed, parking, because a page of it was being purged
     * (heap.c): an abandoned heap's collection releases it later */
    bool purge_wait;
    uint64_t allocs; /* blocks handed out by this heap (owner only) */
    uint64_t frees;  /* blocks this heap's thread freed, its own or others' (owner only) */
    /* the sampled heap profile's windows (src/profile.h); NULL when off.
     * Here, not after the per-class arrays: every new span of a class reads
     * it (lull_heap_set_current), and a read of a page the heap never wrote
     * makes it resident where the kernel maps no shared zero page */
    struct lull_heap_profile *profile;
    /* the block of its own that this thread freed last, not yet checked
     * nor linked (src/alloc.h, "the deferred free"), and its span; when
     * none, the mark &deferred_none and a NULL span. Counted in its span's
     * used until then. */
    struct lull_block *deferred;
    struct lull_span *deferred_span;
    /* the mark of an empty slot: not NULL, so that free() has one compare
     * fewer (2 instructions). Its word is a last link's (next == 0), so the
     * free that "links" it takes lull_free_local_checked, which knows it. */
    struct lull_block deferred_none;
    uint64_t spans_taken;
    uint64_t spans_returned;
    /* spans kept for reuse when they empty (heap.c), oldest evicted first */
    struct lull_span *kept[LULL_KEPT_SLOTS];
    uint64_t kept_bytes;
    uint32_t kept_next;
    uint32_t outbox_pending; /* bit i: outbox[i] holds blocks */
    lull_outbox_slot outbox[LULL_OUTBOX_SLOTS];
    /* the span this heap's thread is freeing a block onto (the span's own
     * list: src/alloc.c's remote_free), set before the CAS that may set
     * LULL_REMOTE_QUEUED and cleared once the span is pushed: a fork child
     * copied between the two pushes it (src/heap.c) */
    _Atomic(struct lull_span *) remote_queuing;
    /* ---- written by other threads: a line of their own, ahead of the
     * large per-class arrays below, most of which a thread never touches:
     * at the end it was one more of the heap's pages resident ---- */
    _Alignas(64) _Atomic(lull_span *) remote_spans; /* spans that got remote frees */
    /* messages of remote frees (src/outbox.c), one list: each message's
     * tail links to the message pushed before it */
    _Atomic(lull_block *) inbox;
    /* src/reuse.h: blocks of other heaps' spans this thread freed and hands
     * out again itself. reuse[c] is a stand-in span descriptor: its `free`
     * is the list of class c (linked as a span's free list, all of one
     * segment), minus its `used` the count, so that direct[] can lead
     * malloc's fast path to it */
    _Alignas(64) uint8_t reuse_direct[LULL_CLASSES]; /* direct[] of the class leads to reuse[c] */
    /* at least the bytes on the lists: pops by malloc's fast path do not
     * take theirs off (lull_reuse_fits counts again at the bound) */
    uint32_t reuse_bytes;
    uint32_t reuse_recount_wait; /* frees past the bound before it counts again */
    /* bit c: class c's list took a block since the count last found it
     * empty (the count reads only those: each list is a line of its own) */
    uint64_t reuse_listed[(LULL_CLASSES + 63) / 64];
    lull_span reuse[LULL_CLASSES];
    /* blocks of other segments than their class's list: a second list a
     * class, linked as in a message, popped by the slow path */
    lull_block *reuse_other[LULL_CLASSES];
    uint8_t reuse_other_count[LULL_CLASSES];
    /* src/defrag.c: the heap's counters when its views were last known to
     * be right, and the views (read and written by defrag calls only) */
    uint64_t defrag_allocs, defrag_frees, defrag_taken, defrag_returned;
    uint32_t defrag_epoch;
    lull_defrag_view defrag[LULL_CLASSES];
} lull_heap;

#endif
