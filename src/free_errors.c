/* The shared aborts of invalid frees; see free_errors.h. */
#include "src/free_errors.h"
#include "lull.h"
#include "base/message.h"
#include "base/segment_map.h"
#include "src/size_class.h"
#include "src/span.h"

void lull_fatal_misaligned_by(const char *who, const void *p, const lull_span *span) {
    const uint8_t *start = lull_span_start(span);
    size_t off = (size_t)((const uint8_t *)p - start);
    lull_fatal("%s: invalid pointer %p (inside the %u-byte block at %p)", who, p, span->block_size,
               (const void *)(start + off - off % span->block_size));
}

void lull_fatal_misaligned(const void *p, const lull_span *span) {
    lull_fatal_misaligned_by("free()", p, span);
}

void lull_fatal_misaligned_deferred(const lull_heap *h) {
    lull_fatal_misaligned(h->deferred, h->deferred_span);
}

void lull_fatal_remote_double_free(const void *p) {
    lull_fatal("free(): double free of %p (freed twice from other threads)", p);
}

void lull_fatal_deferred_double_free(const void *p) {
    lull_fatal("free(): double free of %p (freed again while it was free)", p);
}

/* The class (or large/huge kind) a request of this size and alignment gets,
 * compared with the block's. */
void lull_check_sized_free(const char *who, void *p, size_t alignment, size_t size) {
    /* before the size is asked for, whose abort names malloc_usable_size() */
    if (!lull_owns(p)) lull_fatal("%s: invalid pointer %p (not allocated by lull)", who, p);
    /* and so is a freed large block's span, which has no kind left */
    lull_segment *seg = lull_segment_of(p);
    if (!lull_aligned_huge_of(p) && seg->magic == LULL_SEGMENT_MAGIC) {
        uint8_t kind = __atomic_load_n(&lull_span_of(seg, p)->kind, __ATOMIC_ACQUIRE);
        if (kind != LULL_SPAN_SMALL && kind != LULL_SPAN_LARGE)
            lull_fatal("%s: invalid pointer or double free of %p (no block there)", who, p);
    }
    size_t usable = lull_usable_size(p);
    if (size > usable)
        lull_fatal("%s: size %zu is larger than block %p (%zu usable bytes)", who, size, p, usable);
    /* a shrinking realloc keeps the block when the new size is at least
     * half of it (lull_realloc): free_sized() then gets that size, which
     * on its own may ask for a smaller class or kind */
    if (size >= usable / 2) return;
    lull_huge *huge = lull_huge_block_of(p);
    if (huge) {
        /* the size it was asked for, or a shrinking realloc that found no
         * memory for a smaller block kept it for (entry.c) */
        if (size == huge->size) return;
        /* a request gets a huge block only past the largest large one or
         * at an alignment over a quarter segment (alloc_in_heap) */
        if (size <= LULL_LARGE_MAX && alignment <= LULL_SEGMENT_SIZE / 4)
            lull_fatal("%s: size %zu does not match huge block %p of %zu bytes", who, size, p,
                       usable);
        return;
    }
    lull_span *span = lull_span_of(seg, p);
    if (span->kind != LULL_SPAN_SMALL) {
        /* a large one only past the largest class or at an alignment over
         * a slice; but the heap profile puts a sampled small block in a
         * large span of its own (span->sampled), and a shrinking realloc
         * that found no memory keeps its block (span->requested, entry.c) */
        if (size <= LULL_SMALL_MAX && size != span->requested && alignment <= LULL_SLICE_SIZE &&
            !span->sampled)
            lull_fatal("%s: size %zu does not match large block %p of %zu bytes", who, size, p,
                       usable);
        return;
    }
    size_t asked = size < alignment ? alignment : size;
    unsigned c = lull_class_of(asked);
    while (c < lull_class_count && lull_classes[c].block_size % alignment)
        c++;
    if (c != span->size_class)
        lull_fatal("%s: size %zu does not match block %p of %u bytes", who, size, p,
                   span->block_size);
}
