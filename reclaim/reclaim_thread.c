/* The reclaim thread; see reclaim.h.
 *
 * One tick: the huge mappings (reclaim/huge_reclaim.c: cache the freed ones,
 * purge them after the purge delay, unmap those unused for long or beyond
 * the cache's bound), then, for each arena, claim the FREE_DIRTY slices
 * older than the purge delay, purge them as one batch through the backend,
 * and mark them FREE_CLEAN (or put them back as FREE_DIRTY if the kernel
 * refused). The thread sleeps between ticks on a futex that only
 * lull_reclaim_now() wakes: short sleeps while there is work, growing to
 * IDLE_TICK_MS when there is none. A forced tick (lull_purge_all, or an
 * allocation over the heap limit) purges everything instead, whatever the
 * delay (purge_now.h).
 *
 * Each claim..finish step holds the step lock (reclaim_steps.h), which
 * fork's prepare handler takes: a fork never copies a slice taken out of
 * `dirty` but not yet PURGING (the child would leak it) or put into `clean`
 * but still PURGING (the child, which turns PURGING back into dirty, would
 * hand it out twice). */
#include "reclaim/reclaim.h"
#include "lull.h"
#include "lull/counters.h"
#include "numa/arena.h"
#include "numa/page_park.h"
#include "numa/thp.h"
#include "reclaim/huge_cache.h"
#include "reclaim/huge_queue.h"
#include "reclaim/huge_reclaim.h"
#include "reclaim/huge_tail.h"
#include "reclaim/huge_word.h"
#include "reclaim/memory_short.h"
#include "reclaim/policy.h"
#include "reclaim/purge_backend.h"
#include "reclaim/purge_now.h"
#include "reclaim/reclaim_steps.h"
#include "reclaim/refault.h"
#include "reclaim/warm_reserve.h"
#include "base/config.h"
#include "base/fault.h"
#include "base/fork_exec.h"
#include "numa/huge.h"
#include "base/module.h"
#include "base/message.h"
#include "base/resident.h"

#include <errno.h>
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#define BUSY_TICK_MS 2
#define THP_COLLAPSES_PER_TICK 8
#define THP_COLLAPSE_BUDGET_NS 2000000
#define IDLE_TICK_MS 100
/* Every wake-up runs the tick hooks, and the counter page's serves heap
 * profile requests: the idle sleep bounds how long one waits (the ABI
 * promises LULL_COUNTERS_REQUEST_POLL_MS). */
_Static_assert(IDLE_TICK_MS <= LULL_COUNTERS_REQUEST_POLL_MS,
               "the idle sleep is longer than the request poll promised in lull/counters.h");

static struct {
    pthread_t thread;
    _Atomic bool running;
    _Atomic bool start_failed;
    _Atomic uint32_t request_seq; /* futex: lull_reclaim_now() asks */
    _Atomic uint32_t done_seq;    /* futex: the tick that answered */
    /* requests for a forced tick (purge_now.h) not yet taken by a tick:
     * raised before request_seq, taken after it is read */
    _Atomic uint32_t force_pending;
    /* Set (release) once the thread has opened its backend and refault
     * monitor: only then may other threads read their state. */
    _Atomic bool started;
    purge_backend backend;    /* the reclaim thread's alone */
    lull_reclaim_stats stats; /* written by the reclaim thread, read relaxed */
} R LULL_FORK_EXEC_DATA;      /* a fork child resets it */

LULL_FORK_EXEC_DATA _Atomic int lull_reclaim_deferred;

/* Hooks for the modules that ride on the tick (refault monitor, counter
 * page). Each runs on the reclaim thread. */
LULL_FORK_EXEC_DATA void (*lull_reclaim_tick_hook)(void);
LULL_FORK_EXEC_DATA void (*lull_reclaim_thread_start_hook)(void);

/* atomic: a caller's lull_purge_all counts here too when no thread runs */
#define STAT_ADD(field, v) __atomic_fetch_add(&R.stats.field, (v), __ATOMIC_RELAXED)

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *t) {
    return syscall(SYS_futex, (uint32_t *)addr, op, val, t, NULL, 0);
}

long lull_reclaim_effective_delay(void) {
    long d = __atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED);
    if (d != LULL_PURGE_DELAY_AUTO) return d;
    /* any thread (lull_stats); the reclaim thread's policy writes it */
    return __atomic_load_n(&lull_the_policy.delay_ms, __ATOMIC_RELAXED);
}

static int effective_advice(void) {
    /* lull_configure() may change it on another thread */
    switch (__atomic_load_n(&lull_config.purge_mode, __ATOMIC_RELAXED)) {
    case LULL_MODE_FREE:
        return MADV_FREE;
    case LULL_MODE_DONTNEED:
        return MADV_DONTNEED;
    default:
        return lull_policy_mode(&lull_the_policy);
    }
}

/* What has been free for the purge delay. */
static bool purge_due(uint32_t now) {
    purge_backend *b = &R.backend;
    if (__atomic_load_n(&lull_config.purge_delay_ms, __ATOMIC_RELAXED) == LULL_PURGE_DELAY_AUTO) {
        /* the mode's MADV_FREE waits for memory that is not short */
        if (__atomic_load_n(&lull_config.purge_mode, __ATOMIC_RELAXED) == LULL_MODE_AUTO)
            lull_policy_set_memory_short(&lull_the_policy, lull_memory_short_poll(now));
        lull_policy_delay(&lull_the_policy, now);
    }
    long delay = lull_reclaim_effective_delay();
    __atomic_store_n(&R.stats.delay_ms, delay, __ATOMIC_RELAXED);
    int advice = delay >= 0 ? effective_advice() : MADV_DONTNEED;
    bool work = lull_step_huge(b, &R.stats, now, delay, advice, false);
    if (delay >= 0) {
        __atomic_store_n(&R.stats.mode, advice == MADV_FREE ? LULL_MODE_FREE : LULL_MODE_DONTNEED,
                         __ATOMIC_RELAXED);
        uint32_t freed_before = now - (uint32_t)delay;
        for (int i = 0; i < lull_arena_count; i++) {
            lull_arena *a = &lull_arenas[i];
            work |= lull_step_slices(b, &R.stats, a, freed_before, false, advice);
            work |= lull_step_lazy(b, &R.stats, a, now - LULL_POLICY_LAZY_MAX_MS, false);
            work |= lull_step_pages(b, &R.stats, a, freed_before, false);
        }
    }
    if (delay != LULL_PURGE_DELAY_NEVER) work |= lull_step_warm(b, now, false);
    /* the remote frees into heaps of exited threads (src/heap.c's hook):
     * collected here, their emptied spans are purged from the next tick on */
    void (*collect)(void) = __atomic_load_n(&lull_reclaim_collect_hook, __ATOMIC_ACQUIRE);
    if (collect) collect();
    return work;
}

/* Huge pages formed where regions are dense (numa/thp.h): a few a tick,
 * each a few hundred microseconds of this thread's. While the heap grows,
 * within THP_COLLAPSE_BUDGET_NS of this thread's time: a collapse of a
 * region written in small pages copies 2 MiB (1-6 ms here), time the warm
 * reserve needs to keep regions ready ahead of the growth, so that fewer
 * are written in small pages at all; a bound in time rather than one a
 * tick, so that where the reserve leaves the thread time, the regions
 * written in small pages still get collapsed. */
static bool collapse_dense(uint32_t now) {
    if (!lull_thp_tick_start()) return false;
    uint64_t budget = lull_warm_reserve_growing(now) ? THP_COLLAPSE_BUDGET_NS : 0;
    uint64_t until = budget ? lull_thp_thread_cpu_ns() + budget : 0;
    unsigned left = THP_COLLAPSES_PER_TICK;
    for (int i = 0; i < lull_arena_count && left; i++)
        for (lull_segment *s = atomic_load_explicit(&lull_arenas[i].segments, memory_order_acquire);
             s && left && (!until || lull_thp_thread_cpu_ns() < until); s = s->next)
            left -= lull_thp_collapse_dense(s, left, until);
    return left < THP_COLLAPSES_PER_TICK;
}

/* forced: everything free, whatever the delay (purge_now.h), for
 * lull_purge_all and the heap limit */
static bool tick(bool forced) {
    uint32_t now = lull_now_ms();
    /* first: a request thread's fault in new metadata could wait for this
     * tick's collapses and munmaps (numa/arena.h) */
    for (int i = 0; i < lull_arena_count; i++)
        lull_arena_populate_metadata(&lull_arenas[i]);
    bool work = forced ? lull_purge_now(&R.backend, &R.stats) : purge_due(now);
    if (forced)
        STAT_ADD(forced_ticks, 1);
    else if (collapse_dense(now))
        work = true;
    lull_refault_tick(now);
    struct timespec cpu;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &cpu);
    __atomic_store_n(&R.stats.cpu_ns, (uint64_t)cpu.tv_sec * 1000000000u + (uint64_t)cpu.tv_nsec,
                     __ATOMIC_RELAXED);
    STAT_ADD(ticks, 1);
    /* atomic: tests install a hook while this thread runs */
    void (*hook)(void) = __atomic_load_n(&lull_reclaim_tick_hook, __ATOMIC_ACQUIRE);
    if (hook) hook();
    return work;
}

/* Set before the ring exists: its io-wq workers, which run the madvise
 * calls, inherit the class. SCHED_BATCH and SCHED_IDLE never preempt a
 * request thread on wake-up; see docs/configuration.md for the measurement. */
static void set_sched_class(void) {
    static const int policy[] = {SCHED_OTHER, SCHED_BATCH, SCHED_IDLE};
    lull_reclaim_sched c = lull_config.reclaim_sched;
    if (c == LULL_SCHED_NORMAL) return;
    struct sched_param p = {.sched_priority = 0};
    int err = pthread_setschedparam(pthread_self(), policy[c], &p);
    if (err)
        lull_message("reclaim_sched: cannot set the reclaim thread's class (%s); it runs as "
                     "normal",
                     strerror(err));
}

/* The reclaim thread itself: it never waits for its own tick. */
static __thread bool on_reclaim_thread __attribute__((tls_model("initial-exec")));

/* The CPUs of reclaim_cpu this thread runs on (those the kernel has), for
 * its io-wq workers; NULL when it runs unpinned because the set has no CPU
 * it may use (reclaim_start said so). The kernel copies a set only up to
 * its own CPU count: CPU 1000 registered as an empty set, and the start
 * message said "io-wq workers pinned" of workers that ran everywhere
 * (tests/test_reclaim_placement.c). */
static const cpu_set_t *pinned_cpus(cpu_set_t *actual) {
    if (!lull_config.reclaim_cpus_set ||
        pthread_getaffinity_np(pthread_self(), sizeof *actual, actual) != 0)
        return NULL;
    cpu_set_t inside; /* pinned: every CPU it runs on is one of the set */
    CPU_AND(&inside, actual, &lull_config.reclaim_cpus);
    return CPU_EQUAL(&inside, actual) ? actual : NULL;
}

static void *reclaim_main(void *arg) {
    (void)arg;
    pthread_setname_np(pthread_self(), "lull-reclaim");
    set_sched_class();
    /* the ring is created here: IORING_SETUP_SINGLE_ISSUER binds it to
     * this thread, and its io-wq workers inherit this thread's CPU set */
    cpu_set_t actual;
    const cpu_set_t *cpus = pinned_cpus(&actual);
    /* Under the step lock, which fork's prepare handler takes: a fork child
     * closes the backend's and the monitor's descriptors that its copy
     * records as open (ring_open, the pidfd, the monitor's `opened`), and a
     * fork between a descriptor's open and its record left it open in the
     * child, with the ring's mappings (tests/test_race_reclaim_open.c).
     * Now the child has both opened, or neither begun. */
    lull_steps_lock();
    lull_backend_kind kind = purge_backend_open(&R.backend, lull_config.backend, cpus);
    __atomic_store_n(&R.stats.backend, (int)kind, __ATOMIC_RELAXED);
    if (R.backend.fallback_reason[0]) {
        memcpy(R.stats.backend_reason, R.backend.fallback_reason, sizeof R.stats.backend_reason);
        lull_verbose("purge backend %s (%s)", purge_backend_name(kind), R.backend.fallback_reason);
    } else {
        lull_verbose("purge backend %s", purge_backend_name(kind));
    }
    lull_refault_start();
    atomic_store_explicit(&R.started, true, memory_order_release);
    lull_steps_unlock();
    if (lull_reclaim_thread_start_hook) lull_reclaim_thread_start_hook();
    on_reclaim_thread = true;
    unsigned sleep_ms = BUSY_TICK_MS;
    for (;;) {
        uint32_t req = atomic_load_explicit(&R.request_seq, memory_order_acquire);
        /* a request this tick answers (req) raised its force before req */
        bool forced = atomic_exchange(&R.force_pending, 0) != 0;
        bool work = tick(forced);
        atomic_store_explicit(&R.done_seq, req, memory_order_release);
        futex(&R.done_seq, FUTEX_WAKE_PRIVATE, INT32_MAX, NULL);
        sleep_ms =
            work ? BUSY_TICK_MS : (sleep_ms * 2 > IDLE_TICK_MS ? IDLE_TICK_MS : sleep_ms * 2);
        if (atomic_load_explicit(&R.request_seq, memory_order_acquire) != req) continue;
        struct timespec t = {sleep_ms / 1000, (long)(sleep_ms % 1000) * 1000000L};
        futex(&R.request_seq, FUTEX_WAIT_PRIVATE, req, &t);
    }
    return NULL;
}

/* The CPUs the process could run on when it started: the thread starts on
 * first need, on whichever thread needed it, and must not inherit that
 * thread's pinning (a worker pinned to one CPU would pin it there too). */
static LULL_FORK_EXEC_DATA cpu_set_t start_cpus;
static LULL_FORK_EXEC_DATA bool start_cpus_known;

/* cpus NULL: the creator's CPU set. The class is always SCHED_OTHER at
 * first (set_sched_class sets the configured one): a SCHED_FIFO creator
 * would hand down its class too. */
static void thread_attr(pthread_attr_t *attr, const cpu_set_t *cpus) {
    pthread_attr_init(attr);
    pthread_attr_setdetachstate(attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(attr, (size_t)256 << 10);
    pthread_attr_setinheritsched(attr, PTHREAD_EXPLICIT_SCHED);
    pthread_attr_setschedpolicy(attr, SCHED_OTHER);
    struct sched_param p = {.sched_priority = 0};
    pthread_attr_setschedparam(attr, &p);
    if (cpus) pthread_attr_setaffinity_np(attr, sizeof *cpus, cpus);
}

/* A new thread starts with its creator's signal mask: blocking every
 * signal here around pthread_create makes the reclaim thread block them
 * all from its first instruction (and its io-wq workers, which copy its
 * mask), and the creator gets its own mask back. Signals are the program's:
 * one that blocks SIGTERM in its threads and waits with sigwait or a
 * signalfd was killed instead, and its SIGUSR1 handler ran on lull-reclaim
 * (tests/test_signals.c). */
static int create_thread(const cpu_set_t *cpus) {
    pthread_attr_t attr;
    thread_attr(&attr, cpus);
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    int err = pthread_create(&R.thread, &attr, reclaim_main, NULL);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    pthread_attr_destroy(&attr);
    return err;
}

static void reclaim_start(void) {
    if (lull_fault(LULL_FAULT_THREAD_CREATE)) goto failed;
    const cpu_set_t *unpinned = start_cpus_known ? &start_cpus : NULL;
    int err = create_thread(lull_config.reclaim_cpus_set ? &lull_config.reclaim_cpus : unpinned);
    if (err && lull_config.reclaim_cpus_set) {
        /* a CPU set outside the allowed ones: run unpinned, and say so */
        lull_message("reclaim_cpu: cannot pin the reclaim thread (%s); running unpinned",
                     strerror(err));
        err = create_thread(unpinned);
    }
    if (err && unpinned) err = create_thread(NULL); /* the start set shrank since */
    if (err) goto failed;
    atomic_store(&R.running, true);
    return;
failed:
    atomic_store(&R.start_failed, true);
    lull_message("cannot start the reclaim thread: freed memory is reused but not given back to "
                 "the kernel%s",
                 __atomic_load_n(&lull_config.inline_purge, __ATOMIC_RELAXED)
                     ? ""
                     : " (inline_purge=on purges on freeing threads)");
}

/* A deferred thread (reclaim.h): the first caller that asks for it
 * creates it; others go on (a second thread asking meanwhile sees no
 * thread yet, as before the first one asked). */
static void start_deferred(void) {
    int s = atomic_load(&lull_reclaim_deferred);
    while (s == LULL_RECLAIM_DEFERRED || s == LULL_RECLAIM_WANTED)
        if (atomic_compare_exchange_weak(&lull_reclaim_deferred, &s, LULL_RECLAIM_STARTING)) {
            reclaim_start();
            atomic_store(&lull_reclaim_deferred, LULL_RECLAIM_NOT_DEFERRED);
            return;
        }
}

/* lull_now_ms() + 1 when the thread was deferred: at the modules' start,
 * and in a fork child at its first start point (0 until then), not in its
 * fork handler, where the clock's libc and vDSO pages were 2 of a child's
 * page faults; a child that execs or exits at once never reads it. */
static LULL_FORK_EXEC_DATA _Atomic uint32_t deferred_since_ms;

LULL_FORK_EXEC_TEXT void lull_reclaim_note_start_cpus(void) {
    /* once, at the process's start: a fork child keeps the parent's set
     * (the forking thread may be pinned) */
    if (!start_cpus_known)
        /* the system call (it returns the bytes it wrote; the rest of the
         * set is zero already): libc's wrapper is a page fault of every
         * process start of its own, its syscall() is not (the NUMA check
         * right after uses it) */
        start_cpus_known = syscall(SYS_sched_getaffinity, 0, sizeof start_cpus, &start_cpus) > 0;
}

/* since: deferred_since_ms's value (0: noted at the first start point) */
LULL_FORK_EXEC_TEXT static void defer(uint32_t since) {
    atomic_store(&deferred_since_ms, since);
    /* with thp on, the thread is what forms huge pages: wanted from the
     * start, it starts at the first span taken (bench/thp.c's heap, which
     * frees nothing for a while, had no huge page at all) */
    atomic_store(&lull_reclaim_deferred,
                 lull_thp_on() ? LULL_RECLAIM_WANTED : LULL_RECLAIM_DEFERRED);
}

static void defer_start(void) {
    lull_reclaim_note_start_cpus();
    defer(lull_now_ms() + 1);
}

__thread bool lull_reclaim_no_start __attribute__((tls_model("initial-exec")));

void lull_reclaim_want_slow(void) {
    int s = LULL_RECLAIM_DEFERRED; /* only the first want changes it */
    atomic_compare_exchange_strong(&lull_reclaim_deferred, &s, LULL_RECLAIM_WANTED);
}

void lull_reclaim_start_point_slow(void) {
    if (lull_reclaim_no_start) return;
    int s = atomic_load(&lull_reclaim_deferred);
    if (s == LULL_RECLAIM_WANTED) {
        start_deferred();
        return;
    }
    if (s != LULL_RECLAIM_DEFERRED) return;
    uint32_t since = atomic_load(&deferred_since_ms);
    if (!since) { /* a fork child's first start point: its second counts from here */
        atomic_compare_exchange_strong(&deferred_since_ms, &since, lull_now_ms() + 1);
        return;
    }
    if (lull_now_ms() - (since - 1) >= LULL_RECLAIM_START_AFTER_MS) start_deferred();
}

void lull_reclaim_start_now(void) {
    if (atomic_load_explicit(&lull_reclaim_deferred, memory_order_relaxed) !=
            LULL_RECLAIM_NOT_DEFERRED &&
        !lull_reclaim_no_start)
        start_deferred();
}

/* Ask for a tick now: the thread runs one as soon as it wakes (its wait is
 * on request_seq). Returns the request's number, which done_seq reaches
 * when a tick that started after it has finished. forced: that tick purges
 * everything (purge_now.h). The force is raised before the number: a tick
 * that reads the number takes the force after it, so the tick that answers
 * is forced, or an earlier one took the force and did the same work after
 * the request. */
static uint32_t request_tick(bool forced) {
    if (forced) atomic_fetch_add(&R.force_pending, 1);
    uint32_t seq = atomic_fetch_add(&R.request_seq, 1) + 1;
    futex(&R.request_seq, FUTEX_WAKE_PRIVATE, 1, NULL);
    return seq;
}

/* Until the tick that answers request seq has finished, or timeout_ms
 * (< 0: no bound) has passed; true if it has. */
static int64_t mono_ns(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}

static bool futex_wait_for_tick(uint32_t seq, long timeout_ms) {
    int64_t until = timeout_ms >= 0 ? mono_ns() + (int64_t)timeout_ms * 1000000 : 0;
    for (;;) {
        uint32_t done = atomic_load_explicit(&R.done_seq, memory_order_acquire);
        if ((int32_t)(done - seq) >= 0) return true;
        struct timespec t = {0, 50 * 1000000L};
        if (timeout_ms >= 0) {
            int64_t left = until - mono_ns();
            if (left <= 0) return false;
            if (left < t.tv_nsec) t.tv_nsec = (long)left;
        }
        futex(&R.done_seq, FUTEX_WAIT_PRIVATE, done, &t);
    }
}

/* The futex's ETIMEDOUT (every 50 ms poll), EAGAIN and EINTR are how a
 * wait goes, no error of the caller's, whose errno stays: a malloc_trim()
 * returned with errno ETIMEDOUT
 * (glibc_malloc.malloc_trim_leaves_errno_as_it_was). */
static bool wait_for_tick(uint32_t seq, long timeout_ms) {
    int saved = errno;
    bool done = futex_wait_for_tick(seq, timeout_ms);
    errno = saved;
    return done;
}

/* A deferred thread starts now; one a fork child's other thread is
 * creating, the caller waits for. */
static bool thread_runs(void) {
    lull_modules_ensure_started(); /* a process that has allocated nothing yet */
    lull_reclaim_start_now();
    while (atomic_load(&lull_reclaim_deferred) == LULL_RECLAIM_STARTING)
        sched_yield();
    return atomic_load(&R.running);
}

/* A huge malloc takes a cached mapping that fits. With no reclaim thread
 * there is no cache to speak of: it reuses a queued block that fits (first
 * fit), so freed huge blocks do not pile up. The queue is taken whole and
 * the others pushed back, under a lock fork's prepare handler takes
 * (huge_queue.h). */
static lull_huge *huge_take(size_t size, size_t alignment, int node, bool *zeroed) {
    if (alignment > LULL_SLICE_SIZE) {
        /* only the overflow holds blocks aligned past a slice (huge_queue.h);
         * passing over cached mappings that could never serve it is no miss */
        lull_huge *h = lull_huge_queue_take_aligned(size, alignment, node);
        if (h) {
            *zeroed = false; /* never purged: the reclaim thread purges only what it owns */
            h->reuse_gap_ms = LULL_HUGE_NO_GAP;
        }
        return h;
    }
    lull_huge *found = lull_huge_cache_take(size, node, zeroed);
    if (!found && atomic_load_explicit(&R.running, memory_order_relaxed) &&
        lull_huge_cache_bytes() != 0) {
        /* The one wake-up a request thread makes: cached mappings were
         * passed over, and this thread is about to map and touch a new
         * block beside them; an idle reclaim thread would find them a tick
         * of up to 100 ms later. This path makes an mmap anyway. Without
         * it, a program replacing 20-64 MiB blocks at random peaked with
         * 245 MiB of passed-over mappings still resident. */
        request_tick(false);
        return NULL;
    }
    if (found || atomic_load_explicit(&R.running, memory_order_relaxed)) return found;
    *zeroed = false;
    return lull_huge_queue_take_first_fit(size, node);
}

/* The queue's bound (huge_queue.h, LULL_HUGE_QUEUE_WAIT): a huge malloc
 * that found nothing to reuse while the queue holds more address space
 * waits for the reclaim thread's next tick, which unmaps it, and looks
 * again; the request thread itself unmaps nothing. Not on the reclaim
 * thread, nor where the heap limit's relief does not wait (relieve). */
static bool waited_for_backlog(void) {
    if (lull_huge_queue_bytes() <= LULL_HUGE_QUEUE_WAIT) return false;
    if (on_reclaim_thread || lull_reclaim_no_start ||
        !atomic_load_explicit(&R.running, memory_order_relaxed))
        return false;
    STAT_ADD(huge_backlog_waits, 1);
    wait_for_tick(request_tick(false), -1);
    return true;
}

static lull_huge *huge_reuse(size_t size, size_t alignment, int node, bool *zeroed) {
    lull_huge *h = huge_take(size, alignment, node, zeroed);
    if (h || !waited_for_backlog()) return h;
    return huge_take(size, alignment, node, zeroed);
}

/* With no reclaim thread running: is a freed huge mapping (or a shrunk
 * block's tail) unmapped on the freeing thread? Only when configured, and
 * not while a deferred thread, soon started, would take it from the queue. */
static bool unmaps_inline(void) {
    return __atomic_load_n(&lull_config.inline_purge, __ATOMIC_RELAXED) &&
           atomic_load_explicit(&lull_reclaim_deferred, memory_order_relaxed) ==
               LULL_RECLAIM_NOT_DEFERRED;
}

/* free() of a huge block, on any thread: into the cache when the reclaim
 * thread runs (it purges and unmaps from there), else onto its queue. */
void lull_reclaim_huge_push(lull_huge *h) {
    /* a deferred thread is wanted, not created, as by any free (reclaim.h):
     * glibc frees the dynamic TLS blocks of cached thread stacks holding
     * its stack cache's lock, which pthread_create takes, and a join that
     * freed a huge one (a dlopen'ed library's thread-local array) hung
     * there (tests/test_reclaim_start_tls.c) */
    lull_reclaim_want();
    if (atomic_load_explicit(&R.running, memory_order_relaxed)) {
        if (!lull_huge_cache_put(h, lull_now_ms())) lull_huge_queue_push(h);
        return;
    }
    if (unmaps_inline()) {
        STAT_ADD(inline_purges, 1);
        /* counted as the reclaim thread's unmaps are: uncounted, mapped
         * fell by every block freed here and huge_unmapped stayed at 0
         * (tests/test_huge_unmapped_counted.c) */
        STAT_ADD(huge_freed, 1);
        STAT_ADD(huge_freed_bytes, h->map_len);
        lull_huge_unmap(h, true);
        return;
    }
    lull_huge_queue_push(h);
}

/* The tail of a huge block shrunk in place by realloc (numa/huge.h), on its
 * owner's thread: to the reclaim thread, which purges and unmaps it at its
 * next tick, or unmapped here where a freed huge block would be. */
static void huge_tail_push(void *start, size_t len, size_t dirty, int node) {
    lull_reclaim_want();
    if (!atomic_load_explicit(&R.running, memory_order_relaxed) && unmaps_inline()) {
        STAT_ADD(inline_purges, 1);
        STAT_ADD(huge_freed_bytes, len); /* as the reclaim thread's (huge_reclaim.c) */
        lull_huge_unmap_tail(start, len, dirty, node);
        return;
    }
    lull_huge_tail_push(start, len, dirty, node);
}

LULL_EXPORT bool lull_reclaim_now(void) {
    if (!thread_runs()) return false;
    /* a tick that started after our request answers it */
    wait_for_tick(request_tick(false), -1);
    return true;
}

void lull_reclaim_purge_all(void) {
    if (on_reclaim_thread) { /* a tick hook: between steps, as a tick is */
        lull_purge_now(&R.backend, &R.stats);
        return;
    }
    if (thread_runs()) {
        wait_for_tick(request_tick(true), -1);
        return;
    }
    /* No reclaim thread (its start failed, or this thread may not start
     * it): the program asked for the purge, so its caller makes it, as
     * inline_purge's freeing threads do */
    STAT_ADD(inline_purges, 1);
    lull_purge_now_on_caller(&R.stats);
}

/* The heap limit's relief (base/resident.h): a forced tick, waited for at
 * most wait_ms (< 0: until it is done). Not on the reclaim thread (it would wait for
 * itself), nor on an exiting thread past its heap's destructor (it holds
 * the late heap's lock, which the tick's collection takes). A deferred
 * thread starts here (the callers are start points, reclaim.h); one being
 * created is not waited for: this may be its creator's own allocation,
 * inside pthread_create. */
static bool relieve(long wait_ms) {
    if (on_reclaim_thread || lull_reclaim_no_start) return false;
    lull_reclaim_start_now();
    if (!atomic_load(&R.running)) return false;
    STAT_ADD(limit_waits, 1);
    wait_for_tick(request_tick(true), wait_ms);
    return true;
}

/* Any thread. The figures are words the reclaim thread stores atomically
 * while this runs: each is read atomically (no memcpy of the struct), and
 * backend_reason, written once before `started`, only after it. */
void lull_reclaim_get_stats(lull_reclaim_stats *out) {
    lull_modules_ensure_started();
    lull_reclaim_start_now(); /* the statistics report a thread */
#define STAT_GET(field) out->field = __atomic_load_n(&R.stats.field, __ATOMIC_RELAXED)
    STAT_GET(ticks);
    STAT_GET(cpu_ns);
    STAT_GET(purge_runs);
    STAT_GET(purged_bytes);
    STAT_GET(purge_failures);
    STAT_GET(caller_purge_errors);
    STAT_GET(caller_purge_ranges);
    STAT_GET(caller_purge_bytes);
    STAT_GET(caller_purge_calls);
    STAT_GET(huge_freed);
    STAT_GET(huge_freed_bytes);
    STAT_GET(huge_purged_bytes);
    STAT_GET(page_purged_bytes);
    STAT_GET(inline_purges);
    STAT_GET(forced_ticks);
    STAT_GET(limit_waits);
    STAT_GET(huge_backlog_waits);
    STAT_GET(backend);
    STAT_GET(delay_ms);
    STAT_GET(mode);
#undef STAT_GET
    out->running = atomic_load(&R.running);
    out->start_failed = atomic_load(&R.start_failed);
    if (atomic_load_explicit(&R.started, memory_order_acquire))
        memcpy(out->backend_reason, R.stats.backend_reason, sizeof out->backend_reason);
    else
        out->backend_reason[0] = '\0';
}

/* The reclaim thread's backend, for its counters; NULL until the thread has
 * opened it (purge_backend_open rewrites the whole struct). */
const purge_backend *lull_reclaim_backend(void);
const purge_backend *lull_reclaim_backend(void) {
    return atomic_load_explicit(&R.started, memory_order_acquire) ? &R.backend : NULL;
}

/* No step of the reclaim thread is half done while a fork copies the
 * process: every slice is in exactly one map then. */
static void reclaim_fork_prepare(void) {
    lull_steps_lock();
}

static void reclaim_fork_parent(void) {
    lull_steps_unlock();
}

LULL_FORK_EXEC_TEXT static void reclaim_fork_child(void) {
    lull_steps_after_fork_child();
    /* the parent's reclaim thread does not exist here, and its ring must
     * never be used: forget it. A thread of our own starts on first need
     * (reclaim.h), never here: the child stays single-threaded until then.
     * That thread opened its backend and its refault monitor as one step
     * under the step lock (reclaim_main), so the child has both open or
     * neither: with no backend open, there is no monitor to forget either
     * (and refault.c's page of text is not faulted in). */
    bool opened = R.backend.is_open;
    purge_backend_forget_after_fork(&R.backend);
    if (opened) lull_refault_after_fork_child();
    lull_huge_cache_after_fork_child();
    lull_huge_tail_after_fork_child();
    /* A parent whose thread failed to start (pthread_create refused: a
     * thread limit it had reached, RLIMIT_NPROC, a cgroup's pids.max) says
     * nothing of the child, a new process of one thread: its thread is
     * deferred as any child's. Before, the child inherited "never"
     * (NOT_DEFERRED, no thread) and purged nothing for good
     * (tests/test_reclaim_start_fork.c). */
    bool wanted = atomic_load(&R.running) || atomic_load(&R.start_failed) ||
                  atomic_load(&lull_reclaim_deferred) != LULL_RECLAIM_NOT_DEFERRED;
    atomic_store(&R.running, false);
    atomic_store(&R.start_failed, false);
    atomic_store(&R.started, false);
    atomic_store(&R.request_seq, 0);
    atomic_store(&R.done_seq, 0);
    atomic_store(&R.force_pending, 0);
    memset(&R.stats, 0, sizeof R.stats);
    if (wanted)
        defer(0); /* its second counts from its first start point */
    else
        atomic_store(&lull_reclaim_deferred, LULL_RECLAIM_NOT_DEFERRED);
}

static void policy_reused(uint32_t interval_ms, uint32_t n, bool purged, uint32_t since_purge_ms) {
    lull_policy_record_reuse(&lull_the_policy, interval_ms, n, purged, since_purge_ms);
}

static void policy_purged(uint32_t slices) {
    lull_policy_record_purge(&lull_the_policy, slices);
}

/* the tails of shrunk blocks too: a realloc that shrank a 200 MiB block
 * in place held its tail's address space until the next tick, and a 250
 * MiB malloc refused under an address space limit meanwhile failed where
 * it waits for the tick (relief_address_space) */
static uint64_t huge_held(void) {
    return lull_huge_cache_bytes() + lull_huge_queue_bytes() + lull_huge_tail_bytes();
}

static void span_given_back(void) {
    lull_reclaim_want();
}

static void span_taking(void) {
    lull_reclaim_start_point();
}

void (*lull_reclaim_collect_hook)(void);

LULL_FORK_EXEC_TEXT void lull_reclaim_register(void) {
    static const lull_arena_listener listener = {
        .reused = policy_reused,
        .purged = policy_purged,
        .span_given_back = span_given_back,
        .span_taking = span_taking,
    };
    lull_arena_listen(&listener);
    static const lull_module_hooks hooks = {
        .start = defer_start, /* started on first need (reclaim.h) */
        .fork_prepare = reclaim_fork_prepare,
        .fork_parent = reclaim_fork_parent,
        .fork_child = reclaim_fork_child,
    };
    lull_huge_release_hook = lull_reclaim_huge_push;
    lull_huge_tail_hook = huge_tail_push;
    lull_huge_reuse_hook = huge_reuse;
    lull_huge_held_hook = huge_held;
    __atomic_store_n(&lull_resident_relief_hook, relieve, __ATOMIC_RELEASE);
    lull_register_module(&hooks);
}
