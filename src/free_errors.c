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
    size_t usable = lull_usable_size(p);
    if (size > usable)
        lull_fatal("%s: size %zu is larger than block %p (%zu usable bytes)", who, size, p, usable);
    lull_segment *seg = lull_segment_of(p);
    if (lull_aligned_huge_of(p) || seg->magic != LULL_SEGMENT_MAGIC) return;
    lull_span *span = lull_span_of(seg, p);
    if (span->kind != LULL_SPAN_SMALL) return;
    size_t asked = size < alignment ? alignment : size;
    unsigned c = lull_class_of(asked);
    while (c < lull_class_count && lull_classes[c].block_size % alignment)
        c++;
    /* a shrinking realloc keeps the block when the new size is at least
     * half of it (lull_realloc): free_sized() then gets that size */
    if (c != span->size_class && size < usable / 2)
        lull_fatal("%s: size %zu does not match block %p of %u bytes", who, size, p,
                   span->block_size);
}
