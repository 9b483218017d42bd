/* Sampled blocks (profile_sample_kb=1: almost every block of 1 KiB or
 * more is sampled): a sample gets the size it asked for, and a fork while
 * a new thread takes its first stack does not hang. */
#define _GNU_SOURCE
#include "lull.h"
#include "src/heap.h"
#include "src/profile.h"
#include "src/size_class.h"
#include "src/span.h"

#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#include <stdatomic.h>

const char *lull_conf = "profile_sample_kb=1";

static lull_span *span_of(const void *p) {
    return lull_span_of(lull_segment_of(p), p);
}

/* A sampled block of 64 KiB or less, freed, leaves its one-slice span as
 * the heap's spare; the next sampled small block (classes go up to
 * 512 KiB) must still get a block of the size it asked for. */
Test(profile_samples, a_sampled_block_larger_than_a_slice_gets_its_size) {
    /* sampled blocks of 4 KiB, freed: their spans become spares */
    void *small[8];
    unsigned sampled = 0;
    for (int i = 0; i < 8; i++) {
        small[i] = lull_malloc(4096);
        cr_assert_not_null(small[i]);
        if (span_of(small[i])->kind == LULL_SPAN_LARGE) sampled++;
    }
    cr_assert_gt(sampled, 0, "some 4 KiB blocks were sampled");
    for (int i = 0; i < 8; i++)
        lull_free(small[i]);
    lull_heap *h = lull_tl_heap;
    cr_assert_gt(h->profile->spares, 0, "the heap keeps spare spans");
    /* 200 KiB: a small class, sampled with probability 1 - exp(-200) */
    size_t want = 200 * 1024;
    void *p = lull_malloc(want);
    cr_assert_not_null(p);
    size_t usable = lull_usable_size(p);
    lull_span *s = span_of(p);
    cr_assert_geq(usable, want,
                  "a 200 KiB request got %zu usable bytes (span kind %u, %u-byte span, sampled %u)",
                  usable, s->kind, s->block_size, s->sampled);
    memset(p, 0xcd, want);
    lull_free(p);
}

/* ---- fork while a thread takes its first stack ----------------------------- */

#include <sys/wait.h>
#include <unistd.h>

static _Atomic int stop_forking;

static void *forker(void *arg) {
    (void)arg;
    while (!atomic_load(&stop_forking)) {
        pid_t pid = fork();
        if (pid == 0) _exit(0);
        if (pid > 0) waitpid(pid, NULL, 0);
    }
    return NULL;
}

/* A new thread's first sample: its stack walk asks glibc for the thread's
 * stack (pthread_getattr_np), which allocates and frees a small cpu set.
 * With that small block sampled (forced here; at profile_sample_kb=1 a
 * 32-byte block is sampled 3 times in 100), its free takes the profile's
 * lock (lull_profile_forget) from inside the walk, while fork's prepare
 * handler holds that lock and waits for the walk to end. */
static void *first_sample(void *arg) {
    (void)arg;
    void *x = lull_malloc(8); /* the heap, rarely sampled */
    lull_heap *h = lull_tl_heap;
    if (h->profile) {
        h->profile->until_sample[lull_class_of(32)] = 1;
        h->profile->until_sample[lull_class_of(16)] = 1;
        h->profile->until_sample[lull_class_of(4096)] = 1;
    }
    void *y = lull_malloc(4096); /* sampled: the walk */
    lull_free(y);
    lull_free(x);
    return NULL;
}

Test(profile_samples, fork_while_a_new_thread_takes_its_first_stack, .timeout = 60) {
#ifdef LULL_SANITIZED
    /* glibc's cpu set comes from the sanitizer's allocator there, never
     * sampled: nothing to test */
    cr_skip_test("glibc's allocations are not lull's in a sanitizer build");
#endif
    pthread_t f;
    cr_assert_eq(pthread_create(&f, NULL, forker, NULL), 0);
    for (int i = 0; i < 3000; i++) {
        pthread_t t;
        cr_assert_eq(pthread_create(&t, NULL, first_sample, NULL), 0);
        cr_assert_eq(pthread_join(t, NULL), 0);
    }
    atomic_store(&stop_forking, 1);
    cr_assert_eq(pthread_join(f, NULL), 0);
}

/* ---- a sample at the heap limit --------------------------------------------- */

#include "base/resident.h"
#include <stdio.h>

/* At the limit, a malloc whose class span has free blocks needs no new
 * memory; with profiling on, one that is sampled wants a slice of its own
 * for the sampled block. Without that slice it is served unsampled: no
 * refusal counted, errno untouched, and no wait for the reclaim thread's
 * purge (which the limit's relief asks for and the refusal follows). */
Test(profile_samples, a_sample_at_the_limit_does_not_stall_a_malloc_that_fits) {
    lull_set_purge_delay_ms(-1);
    void *warm[64];
    for (int i = 0; i < 8; i++)
        warm[i] = lull_malloc(1000); /* the 1000 B class has a span with room */
    for (int i = 0; i < 8; i++)
        cr_assert_not_null(warm[i]);
    cr_assert(lull_reclaim_now(), "a reclaim thread");
    char v[16];
    snprintf(v, sizeof v, "%u", (unsigned)(lull_resident_bytes() >> 20) + 2);
    cr_assert(lull_configure("heap_limit_mb", v));
    /* fill to the limit: blocks of 64 B, then of 48 KiB */
    static void *fill[1 << 16];
    size_t n = 0;
    while (n < (1 << 16) && (fill[n] = lull_malloc(64)))
        n++;
    while (n < (1 << 16) && (fill[n] = lull_malloc(48 << 10)))
        n++;
    unsigned long long room = lull_resident_room() >> 10;
    uint64_t refused = lull_resident_refusals();
    int enomem = 0;
    void *got[16];
    for (int i = 0; i < 16; i++) {
        errno = 0;
        got[i] = lull_malloc(1000);
        enomem += got[i] && errno == ENOMEM;
        if (!got[i]) break;
    }
    uint64_t refusals = lull_resident_refusals() - refused;
    /* no limit again: Criterion's own logging allocates */
    cr_assert(lull_configure("heap_limit_mb", "0"));
    cr_log_info("%zu blocks to the limit, room %llu KiB; %llu refusals, %d successful mallocs "
                "set ENOMEM",
                n, room, (unsigned long long)refusals, enomem);
    for (int i = 0; i < 16; i++)
        cr_assert_not_null(got[i], "malloc %d of 1000 B fits in its span", i);
    cr_expect_eq(refusals, 0, "%llu allocations were counted refused",
                 (unsigned long long)refusals);
    cr_expect_eq(enomem, 0, "%d mallocs that succeeded set ENOMEM", enomem);
}
