/* The heap profile's stack walk (src/profile_stack.h): lull_stack_take,
 * from its cache of unwind rules, must give the frames that
 * _Unwind_Backtrace gives (lull_stack_take_slow), on stacks of every kind
 * of frame in tests/stack_frames/ (with and without frame pointers, 20 KB
 * of locals, rbp saved as a general register, VLA and alloca frames, a
 * realigned frame, a C++ frame), deep recursion, a thread's stack, a
 * signal handler's (on the thread's stack and on an alternate one), and
 * with its filters; and it must use its own rules (return true) wherever
 * they can say the whole stack, and fall back where they cannot. */
#define _GNU_SOURCE
#include "src/profile_stack.h"
#include "tests/stack_frames/frames.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
    uintptr_t below, skip_from, skip_to; /* the filters of both walks */
    int walks;                           /* probes run */
    bool fast;                           /* what lull_stack_take returned */
    lull_stack got, want;
} probe;

/* Both walks from one call instruction: through a pointer the compiler
 * cannot see, in a loop whose count it cannot see either. */
static bool (*volatile walkers[2])(lull_stack *) = {lull_stack_take, lull_stack_take_slow};
static volatile int two = 2;

__attribute__((noinline)) static void probe_here(probe *p) {
    lull_stack *walked[2] = {&p->got, &p->want};
    bool fast[2];
    for (int i = 0; i < two; i++) {
        *walked[i] =
            (lull_stack){.below = p->below, .skip_from = p->skip_from, .skip_to = p->skip_to};
        fast[i] = walkers[i](walked[i]);
    }
    p->fast = fast[0];
    p->walks++;
}

void frame_step(const char *kinds, void *arg) {
    switch (*kinds) {
    case 0:
        probe_here(arg);
        return;
    case 'o':
        frame_without_fp(kinds + 1, arg);
        return;
    case 'b':
        frame_big_without_fp(kinds + 1, arg);
        return;
    case 'm':
        frame_many_registers(kinds + 1, arg);
        return;
    case 'v':
        frame_vla(kinds + 1, arg);
        return;
    case 'r':
        frame_realigned(kinds + 1, arg);
        return;
    case 'f':
        frame_with_fp(kinds + 1, arg);
        return;
    case 'a':
        frame_alloca(kinds + 1, arg);
        return;
    case 'x':
        frame_cxx(kinds + 1, arg);
        return;
    case 'R': /* recursion: as many frames of frame_step as there are Rs */
        frame_step(kinds + 1, arg);
        __asm__ volatile("" ::: "memory"); /* not a tail call */
        return;
    }
    cr_assert_fail("unknown frame kind %c", *kinds);
}

static void expect_same(const probe *p, const char *what) {
    cr_assert_eq(p->walks, 1, "%s: the probe ran %d times", what, p->walks);
    cr_assert_eq(p->got.depth, p->want.depth, "%s: %u frames, _Unwind_Backtrace gives %u", what,
                 p->got.depth, p->want.depth);
    for (uint32_t i = 0; i < p->got.depth; i++) {
        cr_assert_eq(p->got.ra[i], p->want.ra[i], "%s: frame %u returns to %#lx, not %#lx", what, i,
                     (unsigned long)p->got.ra[i], (unsigned long)p->want.ra[i]);
        cr_assert_eq(p->got.sp[i], p->want.sp[i], "%s: frame %u's stack pointer %#lx, not %#lx",
                     what, i, (unsigned long)p->got.sp[i], (unsigned long)p->want.sp[i]);
    }
}

/* Walks the stack the frames of `kinds` make, twice (the rules are read,
 * then cached), and returns what the second walk did. */
static bool walk_kinds(const char *kinds, probe *p) {
    bool fast = false;
    for (int round = 0; round < 2; round++) {
        p->walks = 0;
        frame_step(kinds, p);
        char what[96];
        snprintf(what, sizeof what, "\"%s\", walk %d", kinds, round + 1);
        expect_same(p, what);
        /* the probe, frame_step and the frames, this test's own, main... */
        cr_assert_geq(p->got.depth, strlen(kinds) < 25 ? strlen(kinds) + 4 : 32, "%s: %u frames",
                      what, p->got.depth);
        fast = p->fast;
    }
    return fast;
}

Test(profile_stack, every_frame_kind_alone) {
    const char *kinds[] = {"", "o", "b", "m", "v", "f", "a", "x"};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        probe p = {0};
        cr_expect(walk_kinds(kinds[i], &p), "\"%s\": the cached rules did not walk it", kinds[i]);
    }
}

/* Every string of up to four kinds: 1,365 stacks, each frame kind above
 * and below every other. */
Test(profile_stack, every_mix_of_four_frames) {
    const char alphabet[] = "obmvfax";
    const int n = (int)strlen(alphabet);
    char kinds[5];
    int stacks = 0;
    for (int len = 1; len <= 4; len++) {
        int combos = 1;
        for (int i = 0; i < len; i++)
            combos *= n;
        for (int k = 0; k < combos; k++) {
            for (int i = 0, rest = k; i < len; i++, rest /= n)
                kinds[i] = alphabet[rest % n];
            kinds[len] = 0;
            probe p = {0};
            cr_expect(walk_kinds(kinds, &p), "\"%s\": the cached rules did not walk it", kinds);
            stacks++;
        }
    }
    cr_expect_gt(stacks, 1000);
}

/* Deeper than the 32 frames kept: both stop at 32. */
Test(profile_stack, deep_recursion) {
    char kinds[64];
    for (int depth = 1; depth < (int)sizeof kinds; depth += 7) {
        memset(kinds, 'R', (size_t)depth);
        kinds[depth] = 0;
        if (depth > 8) kinds[depth / 2] = 'o', kinds[depth / 3] = 'x';
        probe p = {0};
        cr_expect(walk_kinds(kinds, &p), "recursion of %d: not walked by the rules", depth);
        if (depth > 32) cr_expect_eq(p.got.depth, LULL_PROFILE_MAX_DEPTH);
    }
}

/* A realigned frame: gcc gives its CFA by a DWARF expression, so
 * _Unwind_Backtrace walks (clang realigns with rbp and rbx, a rule the
 * cache follows); the frames are the same either way. */
Test(profile_stack, realigned_frame) {
    probe p = {0};
    bool fast = walk_kinds("orf", &p);
#ifdef __clang__
    (void)fast;
#else
    cr_expect_not(fast, "a CFA given by an expression was walked by the rules");
#endif
}

/* The filters: frames below a stack pointer, and those returning into a
 * range, are left out by both. */
Test(profile_stack, filters) {
    probe p = {0};
    walk_kinds("ofmxa", &p);
    lull_stack all = p.want;
    cr_assert_geq(all.depth, 8);
    p = (probe){.below = all.sp[3], .skip_from = all.ra[5], .skip_to = all.ra[5] + 1};
    cr_expect(walk_kinds("ofmxa", &p));
    cr_expect_eq(p.got.depth, all.depth - 4, "%u frames kept of %u", p.got.depth, all.depth);
    cr_expect_eq(p.got.ra[0], all.ra[3]);
    cr_expect_eq(p.got.ra[1], all.ra[4]);
    cr_expect_eq(p.got.ra[2], all.ra[6]);
}

static void *walk_in_thread(void *arg) {
    probe *p = arg;
    p->fast = walk_kinds("mxo", p);
    return NULL;
}

/* Another thread's stack, whose outermost frame is clone's. */
Test(profile_stack, a_thread) {
    probe p = {0};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, walk_in_thread, &p), 0);
    pthread_join(t, NULL);
    cr_expect(p.fast, "a thread's stack was not walked by the rules");
}

static probe signal_probe;
static const char *signal_kinds;

static void on_signal(int sig) {
    (void)sig;
    frame_step(signal_kinds, &signal_probe);
}

static void walk_in_signal(const char *kinds, bool alternate) {
    stack_t alt = {0};
    if (alternate) {
        alt.ss_size = 256 * 1024;
        alt.ss_sp = malloc(alt.ss_size);
        cr_assert_not_null(alt.ss_sp);
        cr_assert_eq(sigaltstack(&alt, NULL), 0);
    }
    struct sigaction sa = {.sa_handler = on_signal, .sa_flags = alternate ? SA_ONSTACK : 0};
    sigemptyset(&sa.sa_mask);
    cr_assert_eq(sigaction(SIGUSR1, &sa, NULL), 0);
    for (int round = 0; round < 2; round++) {
        signal_probe = (probe){0};
        signal_kinds = kinds;
        raise(SIGUSR1);
        expect_same(&signal_probe, alternate ? "on an alternate stack" : "in a signal handler");
        /* the handler's frames, the signal frame, this function, the test's */
        cr_expect_geq(signal_probe.got.depth, strlen(kinds) + 5, "%u frames",
                      signal_probe.got.depth);
        cr_expect_not(signal_probe.fast, "a signal frame was walked by the rules");
    }
    signal(SIGUSR1, SIG_DFL);
    if (alternate) {
        stack_t off = {.ss_flags = SS_DISABLE};
        cr_assert_eq(sigaltstack(&off, NULL), 0);
        free(alt.ss_sp);
    }
}

Test(profile_stack, signal_frames_fall_back) {
    /* the thread's stack bounds are read at its first walk, which may
     * allocate: not in the handler */
    probe p = {0};
    walk_kinds("", &p);
    walk_in_signal("fo", false);
    walk_in_signal("xm", true);
}
