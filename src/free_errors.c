/* The shared aborts of invalid frees; see free_errors.h. */
#include "src/free_errors.h"
#include "base/message.h"
#include "src/span.h"

void lull_fatal_misaligned(const void *p, const lull_span *span) {
    const uint8_t *start = lull_span_start(span);
    size_t off = (size_t)((const uint8_t *)p - start);
    lull_fatal("free(): invalid pointer %p (inside the %u-byte block at %p)", p, span->block_size,
               (const void *)(start + off - off % span->block_size));
}

void lull_fatal_remote_double_free(const void *p) {
    lull_fatal("free(): double free of %p (freed twice from other threads)", p);
}
