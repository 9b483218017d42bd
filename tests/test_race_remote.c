/* Race harness: remote frees racing the owner's collection, the owner's
 * exit and a second free of the same block (issue 12, items 1 and 2).
 *
 * Built only with -DLULL_RACE=ON (base/race.h): the scheduling points of the
 * remote free (before the push, between the push and the queueing of the
 * span), of the owner's collection, of span release and of heap abandon and
 * adopt hold each window open for a time drawn from a seed, so the other
 * thread's step lands inside it. Every scenario runs until each point it
 * arms was reached (a count of events, not a time), and checks what a broken
 * protocol breaks: the contents of every live block (a block handed out
 * twice, or purged by the reclaim thread after its slices were released
 * twice, loses its pattern) and, for double frees, the abort that names the
 * block. */
#define _GNU_SOURCE
#include "lull.h"
#include "base/race.h"

#include "tests/support/mem_check.h"

#include <criterion/criterion.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

/* Remote frees take one of two paths (docs/architecture.md, "remote
 * frees"): blocks of 16 bytes or more go out in messages (src/outbox.h),
 * 8-byte blocks onto their span's own list. A scenario runs with one shape
 * per path. The owner fills three spans of the class and hands every
 * `stride`-th block to the freer, freeing the others itself: the spans
 * empty only when the freer's frees are collected, so collections release
 * them while frees are in flight. */
typedef struct {
    size_t block;
    int blocks; /* three spans' worth */
    int stride;
    int min_rounds;
    uint32_t points; /* the remote-free points of this path */
} shape;

#define MIN_ROUNDS 150
#define MAX_ROUNDS 4000
#define BLOCK 1024            /* a class whose 64 KiB span holds 64 blocks */
#define MAX_BLOCKS (3 * 8192) /* 8-byte blocks: three spans of 8192 */
#define HANDED 192            /* blocks a round hands from owner to freer */

static const shape messages = {
    .block = BLOCK,
    .blocks = 192,
    .stride = 1,
    .min_rounds = 500, /* fast rounds: more of them, so every window is hit often */
    .points = (1u << LULL_RACE_OUTBOX_SEND) | (1u << LULL_RACE_INBOX_APPLY),
};
static const shape span_list = {
    .block = 8,
    .blocks = MAX_BLOCKS,
    .stride = MAX_BLOCKS / HANDED,
    .min_rounds = MIN_ROUNDS,
    .points =
        (1u << LULL_RACE_REMOTE_PUSH) | (1u << LULL_RACE_REMOTE_QUEUE) | (1u << LULL_RACE_COLLECT),
};
static shape cur;
#define HELD 48         /* blocks the bystander keeps live, checked each round */
#define HELD_SIZE 60000 /* one-slice large blocks: they take released slices */
#define MIN_HITS 50

#define MASK(p) (1u << (p))

/* ---- the bystander: live blocks on recycled slices ---------------------- */

/* A thread that keeps HELD one-slice blocks live and replaces one per step,
 * checking the pattern of each before it frees it. A slice released twice
 * is taken by it while still in another span (two blocks on one slice), or
 * purged under it by the reclaim thread (zeroed): both break a pattern. */
static struct {
    pthread_t thread;
    _Atomic bool stop;
    _Atomic uint64_t corrupt;
    _Atomic uint64_t steps;
} by;

static void *bystander(void *arg) {
    (void)arg;
    void *held[HELD] = {0};
    uint64_t seed[HELD] = {0};
    for (uint64_t step = 1; !atomic_load(&by.stop); step++) {
        unsigned i = (unsigned)(step % HELD);
        if (held[i]) {
            if (!pat_check(held[i], HELD_SIZE, seed[i])) atomic_fetch_add(&by.corrupt, 1);
            lull_free(held[i]);
        }
        held[i] = lull_malloc(HELD_SIZE);
        cr_assert_not_null(held[i]);
        seed[i] = step;
        pat_fill(held[i], HELD_SIZE, seed[i]);
        atomic_fetch_add(&by.steps, 1);
        if (step % 64 == 0) lull_reclaim_now();
    }
    for (unsigned i = 0; i < HELD; i++)
        if (held[i]) {
            if (!pat_check(held[i], HELD_SIZE, seed[i])) atomic_fetch_add(&by.corrupt, 1);
            lull_free(held[i]);
        }
    return NULL;
}

static void bystander_start(void) {
    atomic_store(&by.stop, false);
    atomic_store(&by.corrupt, 0);
    cr_assert_eq(pthread_create(&by.thread, NULL, bystander, NULL), 0);
}

static uint64_t bystander_stop(void) {
    atomic_store(&by.stop, true);
    pthread_join(by.thread, NULL);
    return atomic_load(&by.corrupt);
}

/* ---- owner and freer ---------------------------------------------------- */

/* One round's hand-over: the owner fills `blocks`, the freer checks and
 * frees them; `corrupt` counts blocks whose pattern was broken. */
static struct {
    void *blocks[HANDED];
    uint64_t seed;
    _Atomic int phase; /* 0 owner's turn, 1 freer's turn, 2 freer done */
    _Atomic int freed; /* blocks the freer has freed this round */
    _Atomic bool quit;
    _Atomic uint64_t corrupt;
} hand;

static void *freer(void *arg) {
    (void)arg;
    for (;;) {
        int ph;
        while ((ph = atomic_load(&hand.phase)) != 1 && !atomic_load(&hand.quit))
            sched_yield();
        if (ph != 1) return NULL;
        for (int i = 0; i < HANDED; i++) {
            if (!pat_check(hand.blocks[i], cur.block, hand.seed))
                atomic_fetch_add(&hand.corrupt, 1);
            lull_free(hand.blocks[i]);
            atomic_store(&hand.freed, i + 1);
        }
        lull_thread_collect(); /* sends what its outbox still holds */
        atomic_store(&hand.phase, 2);
    }
}

static void fill_batch(uint64_t seed) {
    hand.seed = seed;
    atomic_store(&hand.freed, 0);
    for (int i = 0; i < cur.blocks; i++) {
        void *p = lull_malloc(cur.block);
        cr_assert_not_null(p);
        if (i % cur.stride) {
            lull_free(p);
            continue;
        }
        hand.blocks[i / cur.stride] = p;
        pat_fill(p, cur.block, seed);
    }
}

static bool hits_reached(uint32_t mask) {
    for (int p = 0; p < LULL_RACE_COUNT; p++)
        if ((mask & MASK(p)) && lull_race_hits((lull_race_point_id)p) < MIN_HITS) return false;
    return true;
}

static void report_hits(uint32_t mask, int rounds) {
    char line[512];
    int len = snprintf(line, sizeof line, "%d rounds;", rounds);
    for (int p = 0; p < LULL_RACE_COUNT && len < (int)sizeof line; p++)
        if (mask & MASK(p))
            len += snprintf(line + len, sizeof line - (size_t)len, " %s=%llu",
                            lull_race_point_name((lull_race_point_id)p),
                            (unsigned long long)lull_race_hits((lull_race_point_id)p));
    cr_log_info("%s", line);
}

/* Arm the points of a scenario and start its bystander and freer. */
static pthread_t start_scenario(uint32_t mask, uint64_t seed) {
    lull_race_arm(mask, seed, 200);
    bystander_start();
    pthread_t f;
    cr_assert_eq(pthread_create(&f, NULL, freer, NULL), 0);
    return f;
}

/* Stop the freer and the bystander, disarm, and check what a broken
 * protocol breaks: every armed point reached, every block intact. */
static void finish_scenario(pthread_t freer_thread, uint32_t mask, int rounds) {
    atomic_store(&hand.quit, true);
    pthread_join(freer_thread, NULL);
    uint64_t bad = bystander_stop();
    report_hits(mask, rounds);
    bool reached = hits_reached(mask);
    lull_race_arm(0, 0, 0);
    cr_assert(reached, "not every point was reached in %d rounds", rounds);
    cr_assert_eq(atomic_load(&hand.corrupt), 0, "%llu handed-over blocks lost their contents",
                 (unsigned long long)atomic_load(&hand.corrupt));
    cr_assert_eq(bad, 0, "%llu live blocks lost their contents", (unsigned long long)bad);
}

static void race_init(void) {
    lull_set_purge_delay_ms(0); /* released slices are purged at once */
    atomic_store(&hand.phase, 0);
    atomic_store(&hand.quit, false);
    atomic_store(&hand.corrupt, 0);
}

/* The owner collects its spans directly (lull_thread_collect, as a refill or
 * a thread exit does) while the freer's remote frees are in flight: between
 * pushing the block and queueing the span (the span-list path), or between
 * sending a message and its owner applying it (messages). The old protocol
 * released such a span, then the freer queued it, and the owner released it
 * a second time. */
static void racing_the_owners_collection(const shape *sh, uint64_t seed) {
    cur = *sh;
    uint32_t mask = cur.points | MASK(LULL_RACE_SPAN_RELEASE);
    pthread_t f = start_scenario(mask, seed);
    int round = 0;
    for (; round < MAX_ROUNDS && (round < cur.min_rounds || !hits_reached(mask)); round++) {
        fill_batch((uint64_t)round + 1);
        atomic_store(&hand.phase, 1);
        while (atomic_load(&hand.phase) != 2)
            lull_thread_collect();
        lull_thread_collect();
        atomic_store(&hand.phase, 0);
    }
    finish_scenario(f, mask, round);
}

Test(race, remote_free_racing_the_owners_collection, .init = race_init, .timeout = 120) {
    racing_the_owners_collection(&span_list, 0x5eed0001);
}

Test(race, message_racing_the_owners_collection, .init = race_init, .timeout = 120) {
    racing_the_owners_collection(&messages, 0x5eed0003);
}

/* The owner thread exits (its heap is collected and abandoned) while the
 * remote frees of its blocks are in flight, and a new thread adopts the heap
 * while the second half of them still is: messages to an abandoned heap are
 * applied by their sender, the reclaim thread or the adopter, whichever
 * comes first, and never two of them at once. */
static void *short_owner(void *arg) {
    fill_batch((uint64_t)(uintptr_t)arg);
    atomic_store(&hand.phase, 1);
    /* collect until half the frees are done, then exit: the rest race the
     * abandon's collection of every span and the adoption */
    while (atomic_load(&hand.freed) < HANDED / 2 && atomic_load(&hand.phase) == 1)
        lull_thread_collect();
    return NULL;
}

#define ADOPTER_BLOCKS 256

/* The next thread: it adopts the heap the owner left (the latest abandoned
 * one), allocates from it while messages arrive, and checks its blocks. */
static void *adopter(void *arg) {
    uint64_t seed = (uint64_t)(uintptr_t)arg;
    static __thread void *mine[ADOPTER_BLOCKS];
    for (int i = 0; i < ADOPTER_BLOCKS; i++) {
        mine[i] = lull_malloc(cur.block);
        cr_assert_not_null(mine[i]);
        pat_fill(mine[i], cur.block, seed + (uint64_t)i);
        if (i % 32 == 0) lull_thread_collect();
    }
    for (int i = 0; i < ADOPTER_BLOCKS; i++) {
        if (!pat_check(mine[i], cur.block, seed + (uint64_t)i)) atomic_fetch_add(&hand.corrupt, 1);
        lull_free(mine[i]);
    }
    return NULL;
}

static void racing_the_owners_exit(const shape *sh, uint64_t seed) {
    cur = *sh;
    uint32_t mask =
        cur.points | MASK(LULL_RACE_SPAN_RELEASE) | MASK(LULL_RACE_ABANDON) | MASK(LULL_RACE_ADOPT);
    pthread_t f = start_scenario(mask, seed);
    int round = 0;
    for (; round < MAX_ROUNDS && (round < cur.min_rounds || !hits_reached(mask)); round++) {
        pthread_t o;
        cr_assert_eq(pthread_create(&o, NULL, short_owner, (void *)(uintptr_t)(round + 1)), 0);
        pthread_join(o, NULL);
        pthread_t a;
        cr_assert_eq(pthread_create(&a, NULL, adopter, (void *)((uintptr_t)(round + 1) << 20)), 0);
        pthread_join(a, NULL);
        while (atomic_load(&hand.phase) != 2)
            sched_yield();
        atomic_store(&hand.phase, 0);
    }
    finish_scenario(f, mask, round);
}

Test(race, remote_free_racing_the_owners_exit, .init = race_init, .timeout = 120) {
    racing_the_owners_exit(&span_list, 0x5eed0002);
}

Test(race, message_racing_the_owners_exit, .init = race_init, .timeout = 120) {
    racing_the_owners_exit(&messages, 0x5eed0004);
}

/* ---- a block freed by its owner and by another thread ------------------- */

static void *free_on_another_thread(void *block) {
    lull_free(block);
    return NULL;
}

static void free_remotely(void *block) {
    pthread_t t;
    pthread_create(&t, NULL, free_on_another_thread, block);
    pthread_join(t, NULL);
}

/* In a child, with the remote-free and collection points armed: the owner
 * frees a block and another thread frees it again (owner_first), or the
 * other way round; then the owner allocates the class again and again. The
 * child must die of SIGABRT with lull's message naming the block; the old
 * protocol put the block on both lists and crashed with no message or
 * handed it out twice. */
static void double_free_child(uint64_t seed, bool owner_first, char *msg, size_t cap, int *status) {
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(fds[1], STDERR_FILENO);
        close(fds[0]);
        lull_race_arm(MASK(LULL_RACE_REMOTE_PUSH) | MASK(LULL_RACE_REMOTE_QUEUE) |
                          MASK(LULL_RACE_COLLECT),
                      seed, 100);
        void *block = lull_malloc(BLOCK), *keep[8];
        for (int i = 0; i < 8; i++)
            keep[i] = lull_malloc(BLOCK); /* the span stays in use */
        fprintf(stderr, "block %p\n", block);
        if (owner_first) {
            lull_free(block);
            free_remotely(block);
        } else {
            free_remotely(block);
            lull_free(block);
        }
        for (int i = 0; i < 4 * 192; i++) /* refills collect the remote list */
            memset(lull_malloc(BLOCK), 0xab, BLOCK);
        (void)keep;
        _exit(0);
    }
    close(fds[1]);
    size_t len = 0;
    for (ssize_t n; len < cap - 1 && (n = read(fds[0], msg + len, cap - 1 - len)) > 0;)
        len += (size_t)n;
    msg[len] = 0;
    close(fds[0]);
    cr_assert_eq(waitpid(pid, status, 0), pid);
}

static void expect_double_free_abort(bool owner_first) {
    for (uint64_t seed = 1; seed <= 8; seed++) {
        char msg[4096];
        int status;
        double_free_child(seed, owner_first, msg, sizeof msg, &status);
        void *block = NULL;
        cr_assert_eq(sscanf(msg, "block %p", &block), 1, "child said '%s'", msg);
        char addr[32];
        snprintf(addr, sizeof addr, "%p", block);
        cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
                  "seed %llu: the child did not abort (status %#x): '%s'", (unsigned long long)seed,
                  status, msg);
        cr_assert_not_null(strstr(msg, "double free"), "seed %llu: '%s'", (unsigned long long)seed,
                           msg);
        cr_assert_not_null(strstr(msg, addr), "seed %llu: the message does not name %s: '%s'",
                           (unsigned long long)seed, addr, msg);
    }
}

Test(race, freed_by_its_owner_then_by_another_thread_aborts, .timeout = 120) {
    expect_double_free_abort(true);
}

Test(race, freed_by_another_thread_then_by_its_owner_aborts, .timeout = 120) {
    expect_double_free_abort(false);
}
