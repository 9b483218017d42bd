/* A sized free of a large or huge block (free_sized(), free_aligned_sized(),
 * a C++ sized delete) with a size no request of that block could have had
 * aborts, as one of a small block does: free_sized(malloc(1 MiB), 8), or a
 * 1 MiB object deleted through a pointer to an 8-byte base class, went
 * through unseen. The sizes a block may be freed with still pass: its
 * request's, its usable size, what a shrinking realloc kept it for, and an
 * aligned request's with its alignment. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/span.h"
#include "base/types.h"

#include "tests/support/fork_capture.h"

#include <criterion/criterion.h>
#include <stdint.h>
#include <string.h>

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)

static void warm(void) {
    lull_free(lull_malloc(16));
}

static void *block;
static size_t wrong_size;

static void free_sized_wrong(void *p) {
    lull_free_sized(p, wrong_size);
}

static void expect_wrong_size(void *p, size_t size) {
    wrong_size = size;
    child_result r;
    run_in_child(free_sized_wrong, p, &r);
    expect_abort(&r, p, "does not match");
}

Test(sized_free_kinds, a_large_block_freed_with_a_small_size, .init = warm) {
    block = lull_malloc(1 * MiB);
    cr_assert_not_null(block);
    expect_wrong_size(block, 8);
    expect_wrong_size(block, 1000);
    expect_wrong_size(block, 100 * KiB);
    lull_free_sized(block, 1 * MiB);
}

Test(sized_free_kinds, a_huge_block_freed_with_a_small_size, .init = warm) {
    block = lull_malloc(20 * MiB);
    cr_assert_not_null(block);
    expect_wrong_size(block, 8);
    expect_wrong_size(block, 1 * MiB);
    expect_wrong_size(block, 9 * MiB);
    lull_free_sized(block, 20 * MiB);
}

/* A large span takes slices that a span of 8-byte blocks had: the sized
 * fast path (sizes up to 1 KiB) compares the size's class with the span's,
 * which a large span must not seem to have. */
Test(sized_free_kinds, a_large_block_where_small_spans_were, .init = warm) {
    enum { N = 200000 }; /* 24 spans of 8-byte blocks */
    static void *small[N];
    for (int i = 0; i < N; i++) {
        small[i] = lull_malloc(8);
        cr_assert_not_null(small[i]);
    }
    for (int i = 0; i < N; i++)
        lull_free(small[i]);
    lull_thread_collect(); /* the empty spans back to the arena */
    block = lull_malloc(1 * MiB);
    cr_assert_not_null(block);
    expect_wrong_size(block, 8);
    lull_free_sized(block, 1 * MiB);
}

Test(sized_free_kinds, the_sizes_a_block_may_have_still_pass, .init = warm) {
    static const size_t sizes[] = {600 * KiB, 1 * MiB, 5 * MiB, 16 * MiB, 17 * MiB, 40 * MiB};
    for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
        void *p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        lull_free_sized(p, sizes[k]);
        p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        lull_free_sized(p, lull_usable_size(p));
        /* kept by a realloc that shrinks it by less than half */
        p = lull_malloc(sizes[k]);
        cr_assert_not_null(p);
        size_t kept = lull_usable_size(p) / 2 + 1;
        cr_assert_eq(lull_realloc(p, kept), p);
        lull_free_sized(p, kept);
    }
    /* aligned past a slice: large for any size; past a quarter segment:
     * huge for any size */
    static const size_t aligns[] = {128 * KiB, 1 * MiB, 8 * MiB, 16 * MiB, 64 * MiB};
    for (size_t k = 0; k < sizeof aligns / sizeof aligns[0]; k++) {
        void *p = lull_aligned_alloc(aligns[k], 100);
        cr_assert_not_null(p);
        lull_free_aligned_sized(p, aligns[k], 100);
    }
}

#ifdef LULL_OVERRIDE
void *_Znwm(size_t size);
void _ZdlPvm(void *p, size_t size);

static void delete_as_8_bytes(void *p) {
    _ZdlPvm(p, 8);
}

/* a 1 MiB object deleted through an 8-byte base without a virtual
 * destructor */
Test(sized_free_kinds, a_large_object_deleted_with_a_small_size, .init = warm) {
    void *p = _Znwm(1 * MiB);
    cr_assert_not_null(p);
    child_result r;
    run_in_child(delete_as_8_bytes, p, &r);
    expect_abort(&r, p, "does not match");
    _ZdlPvm(p, 1 * MiB);
}
#endif
