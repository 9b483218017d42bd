/* Start-up and fork. The core initialises lazily on the first malloc
 * (which may come from the dynamic loader, before any constructor), and so
 * do the modules (NUMA topology, counter page, the reclaim thread's
 * deferral): a process that allocates nothing (the preloaded /bin/true of
 * a fork+exec) sets nothing up. Only where the NUMA module would dlopen
 * libnuma (more than one possible node), which must not run inside a
 * malloc, do they start from the library constructor; the reclaim thread
 * is created on first need (reclaim/reclaim.h). */
#include "src/init.h"
#include "base/module.h"
#include "numa/arena.h"
#include "numa/numa_module.h"
#include "reclaim/reclaim.h"
#include "reclaim/huge_queue.h"
#include "base/config.h"
#include "base/fault.h"
#include "base/fork_exec.h"
#include "src/heap.h"
#include "src/profile.h"
#include "base/message.h"
#include "base/no_cancel.h"
#include "base/os.h"
#include "base/race.h"
#include "src/size_class.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <unistd.h>

static LULL_FORK_EXEC_DATA _Atomic int init_state; /* 0 none, 1 running, 2 done */

/* The modules' start: 0 the constructor has not run, 1 it put the start off
 * until the first allocation, 2 starting, 3 started. While one thread
 * starts them, another's first allocation waits (it holds no lull lock
 * yet: the core reads what the start writes, the NUMA arenas and the home
 * node function), and an allocation nested in the start (on the starting
 * thread) goes on with the core alone. */
static LULL_FORK_EXEC_DATA _Atomic int modules_state;
static __thread bool tl_starting_modules __attribute__((tls_model("initial-exec")));

/* Cancellation off (base/no_cancel.h): a thread cancelled inside would leave
 * "starting" (or the core's "initialising") for ever. */
static void start_modules(void) {
    int cancel = lull_cancel_off();
    tl_starting_modules = true;
    LULL_RACE_POINT(LULL_RACE_MODULE_START); /* a fork from another thread lands here */
    lull_modules_run(LULL_MODULE_START, 0);
    lull_config_mark_started();
    lull_verbose("%s active (pid %d)",
                 "lull "
                 "0.1.0",
                 (int)getpid());
    tl_starting_modules = false;
    atomic_store_explicit(&modules_state, 3, memory_order_release);
    lull_cancel_restore(cancel);
}

static void start_modules_if_put_off(void) {
    int state = atomic_load_explicit(&modules_state, memory_order_acquire);
    if (state == 3 || state == 0 || tl_starting_modules) return;
    int expected = 1;
    if (state == 1 && atomic_compare_exchange_strong(&modules_state, &expected, 2)) {
        start_modules();
        return;
    }
    while (atomic_load_explicit(&modules_state, memory_order_acquire) == 2)
        sched_yield();
}

static void init_core(void);

bool lull_ensure_init(void) {
    int s = atomic_load_explicit(&init_state, memory_order_acquire);
    if (s != 2) init_core();
    start_modules_if_put_off();
    return true;
}

static void init_core(void) {
    int expected = 0;
    if (atomic_compare_exchange_strong(&init_state, &expected, 1)) {
        int cancel = lull_cancel_off();       /* see start_modules */
        LULL_RACE_POINT(LULL_RACE_CORE_INIT); /* a fork from another thread lands here */
        lull_config_load();
        /* before the first heap: each heap samples from its creation */
        atomic_store_explicit(&lull_profile_interval, lull_config.profile_sample_bytes,
                              memory_order_relaxed);
        const char *faults = secure_getenv("LULL_FAULT"); /* never in a setuid or setcap process */
        if (faults) lull_fault_parse(faults);
        lull_size_classes_init();
        lull_os_init();
        lull_arenas_init(1);
        lull_heaps_init();
        atomic_store_explicit(&init_state, 2, memory_order_release);
        lull_cancel_restore(cancel);
        return;
    }
    /* another thread is initialising: it allocates nothing and takes no
     * lock, so this wait is short */
    while (atomic_load_explicit(&init_state, memory_order_acquire) != 2)
        sched_yield();
}

/* The modules' locks first: the reclaim thread holds its step lock while it
 * takes an arena's lock (the warm reserve maps a spare segment) or the heap
 * registry's (its own first malloc), so that order is the only one. */
static void fork_prepare(void) {
    /* a start in progress on another thread finishes first: the child would
     * inherit "starting" (or the core's "initialising", which no fork
     * handler waited for before session 27) with no thread to finish it,
     * and its first allocation would wait for ever (tests/test_race_start.c).
     * The core's initialisation takes no lock and never forks. */
    while (atomic_load_explicit(&init_state, memory_order_acquire) == 1)
        sched_yield();
    if (!tl_starting_modules)
        while (atomic_load_explicit(&modules_state, memory_order_acquire) == 2)
            sched_yield();
    lull_modules_run(LULL_MODULE_FORK_PREPARE, 1);
    /* the reclaim thread is between steps now: hold the fork here */
    LULL_RACE_POINT(LULL_RACE_FORK);
    lull_heaps_fork_prepare();
    lull_huge_queue_fork_prepare(); /* after late_lock: a late huge malloc takes it */
    for (int i = 0; i < lull_arena_count; i++)
        pthread_mutex_lock(&lull_arenas[i].lock);
}

static void fork_parent(void) {
    for (int i = lull_arena_count - 1; i >= 0; i--)
        pthread_mutex_unlock(&lull_arenas[i].lock);
    lull_huge_queue_fork_parent();
    lull_heaps_fork_parent();
    lull_modules_run(LULL_MODULE_FORK_PARENT, 0);
}

LULL_FORK_EXEC_TEXT static void fork_child(void) {
    lull_arenas_after_fork_child();
    lull_huge_queue_fork_child();
    lull_heaps_fork_child();
    lull_modules_run(LULL_MODULE_FORK_CHILD, 0);
}

LULL_FORK_EXEC_TEXT static void run_at_exit(void *unused) {
    (void)unused;
    lull_modules_run(LULL_MODULE_AT_EXIT, 1);
}

#ifdef __GLIBC__
/* What glibc's pthread_atfork and atexit are: stubs of libc_nonshared.a
 * linked into each library that calls them, which call these with the
 * library's __dso_handle (so that dlclose drops its handlers). Linked last,
 * they lie at the end of lull's text, a 64 KiB fault-around window of
 * their own: one page fault of every process start. */
extern void *__dso_handle __attribute__((weak, visibility("hidden")));
int __register_atfork(void (*prepare)(void), void (*parent)(void), void (*child)(void), void *dso);
int __cxa_atexit(void (*fn)(void *), void *arg, void *dso);

LULL_FORK_EXEC_TEXT static void register_fork_and_exit(void) {
    __register_atfork(fork_prepare, fork_parent, fork_child, __dso_handle);
    __cxa_atexit(run_at_exit, NULL, __dso_handle);
}
#else
static void run_at_exit_void(void) {
    run_at_exit(NULL);
}

static void register_fork_and_exit(void) {
    pthread_atfork(fork_prepare, fork_parent, fork_child);
    atexit(run_at_exit_void);
}
#endif

void lull_modules_register_all(void); /* modules.c: the list of modules */

static void ensure_started(void) {
    lull_ensure_init();
}

LULL_FORK_EXEC_TEXT __attribute__((constructor(101))) static void lull_constructor(void) {
    lull_modules_set_starter(ensure_started);
    lull_reclaim_note_start_cpus(); /* before main() can pin this thread */
    lull_modules_register_all();
    register_fork_and_exit();
    /* Nothing allocated yet, and no library to load: the first allocation
     * starts everything. A preloaded /bin/true, which allocates nothing,
     * took 18 page faults and 12 system calls more than with an empty
     * preloaded library (perf stat; fork+exec bench: see docs/status.md). */
    if (atomic_load_explicit(&init_state, memory_order_acquire) == 0 &&
        !lull_numa_start_loads_library()) {
        atomic_store(&modules_state, 1);
        return;
    }
    init_core();
    atomic_store(&modules_state, 2);
    start_modules();
}
