/* Where the reclaim thread runs: reclaim_cpu pins it and its io-wq workers
 * (the threads that execute its madvise calls) to a CPU set, and
 * reclaim_sched gives both a scheduling class that never preempts a request
 * thread on wake-up. Each case runs this program again with its LULL_CONF
 * (tests/support/reexec.h), because both keys apply at start only. */
#define _GNU_SOURCE
#include "lull.h"
#include "lull/counters.h"
#include "tests/support/reexec.h"
#include "tests/support/task_list.h"

#include <criterion/criterion.h>
#include <dirent.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define MiB ((size_t)1 << 20)

/* Prints policy and CPU mask (first 64 CPUs) of one thread. */
static void print_thread(const char *prefix, int tid) {
    printf("%s_policy=%d\n%s_cpus=%llu\n", prefix, sched_getscheduler(tid), prefix,
           task_cpu_mask(tid));
}

/* The scenario: make the reclaim thread purge through its ring (so io-wq
 * workers exist), then report the reclaim thread and its workers. */
__attribute__((constructor(200))) static void scenario_main(void) {
    if (!getenv("LULL_TEST_PLACEMENT")) return;
    lull_set_purge_delay_ms(0);
    for (int round = 0; round < 4; round++) {
        char *p = lull_malloc(8 * MiB); /* a large span: its slices go back dirty */
        if (!p) _exit(2);
        memset(p, 1, 8 * MiB);
        lull_free(p);
        if (!lull_reclaim_now()) _exit(3);
    }
    struct lull_counters c;
    lull_stats(&c);
    printf("backend=%llu\n", (unsigned long long)c.backend);
    int reclaim_tid = 0, workers = 0;
    DIR *d = opendir("/proc/self/task");
    if (!d) _exit(4);
    for (struct dirent *e; (e = readdir(d));) {
        char comm[64];
        if (e->d_name[0] == '.') continue;
        read_task_comm(e->d_name, comm, sizeof comm);
        if (strcmp(comm, "lull-reclaim") == 0) reclaim_tid = atoi(e->d_name);
    }
    rewinddir(d);
    char worker_comm[64];
    snprintf(worker_comm, sizeof worker_comm, "iou-wrk-%d", reclaim_tid);
    for (struct dirent *e; (e = readdir(d));) {
        char comm[64];
        if (e->d_name[0] == '.') continue;
        read_task_comm(e->d_name, comm, sizeof comm);
        if (strcmp(comm, worker_comm) != 0) continue;
        char prefix[32];
        snprintf(prefix, sizeof prefix, "worker%d", workers++);
        print_thread(prefix, atoi(e->d_name));
    }
    closedir(d);
    printf("found_reclaim=%d\nworkers=%d\n", reclaim_tid != 0, workers);
    if (reclaim_tid) print_thread("reclaim", reclaim_tid);
    fflush(stdout);
    _exit(0);
}

static void run_with(const char *conf, child_run *cr) {
    static char conf_var[256];
    snprintf(conf_var, sizeof conf_var, "LULL_CONF=%s", conf);
    const char *vars[] = {"LULL_TEST_PLACEMENT=1", conf_var, NULL};
    reexec_run("test_reclaim_placement_scenario", vars, conf, 60000, cr);
    reexec_assert_exited_0(cr, conf);
    cr_assert_eq(reexec_field(cr, "found_reclaim"), 1, "%s: no thread named lull-reclaim", conf);
}

static bool uses_ring(const child_run *cr) {
    return reexec_field(cr, "backend") == LULL_COUNTERS_BACKEND_URING;
}

/* Every worker's field equals `want`. */
static void assert_workers(const child_run *cr, const char *field, uint64_t want) {
    uint64_t n = reexec_field(cr, "workers");
    cr_assert_geq(n, 1, "the reclaim thread purged through io_uring but has no io-wq worker");
    for (uint64_t i = 0; i < n; i++) {
        char key[48];
        snprintf(key, sizeof key, "worker%llu_%s", (unsigned long long)i, field);
        cr_assert_eq(reexec_field(cr, key), want, "%s of io-wq worker %llu", field,
                     (unsigned long long)i);
    }
}

static int last_allowed_cpu(void) {
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    int cpu = -1;
    for (int c = 0; c < 64; c++)
        if (CPU_ISSET(c, &allowed)) cpu = c;
    cr_assert_geq(cpu, 0, "no allowed CPU below 64");
    return cpu;
}

Test(reclaim_placement, default_is_normal_class_and_unpinned, .timeout = 90) {
    child_run cr;
    run_with("purge_delay_ms=0", &cr);
    cr_assert_eq(reexec_field(&cr, "reclaim_policy"), SCHED_OTHER);
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    cr_assert_eq(__builtin_popcountll(reexec_field(&cr, "reclaim_cpus")), CPU_COUNT(&allowed),
                 "the reclaim thread is pinned without reclaim_cpu");
}

Test(reclaim_placement, reclaim_cpu_pins_thread_and_workers, .timeout = 90) {
    int cpu = last_allowed_cpu();
    char conf[64];
    snprintf(conf, sizeof conf, "reclaim_cpu=%d", cpu);
    child_run cr;
    run_with(conf, &cr);
    cr_assert_eq(reexec_field(&cr, "reclaim_cpus"), 1ull << cpu);
    if (!uses_ring(&cr)) cr_skip_test("io_uring unavailable: no io-wq workers to check");
    assert_workers(&cr, "cpus", 1ull << cpu);
}

Test(reclaim_placement, reclaim_sched_idle_reaches_thread_and_workers, .timeout = 90) {
    child_run cr;
    run_with("reclaim_sched=idle", &cr);
    cr_assert_eq(reexec_field(&cr, "reclaim_policy"), SCHED_IDLE);
    if (!uses_ring(&cr)) cr_skip_test("io_uring unavailable: no io-wq workers to check");
    assert_workers(&cr, "policy", SCHED_IDLE);
}

Test(reclaim_placement, reclaim_sched_batch, .timeout = 90) {
    child_run cr;
    run_with("reclaim_sched=batch", &cr);
    cr_assert_eq(reexec_field(&cr, "reclaim_policy"), SCHED_BATCH);
}

Test(reclaim_placement, bad_reclaim_sched_is_reported_and_default_kept, .timeout = 90) {
    child_run cr;
    run_with("reclaim_sched=fastest", &cr);
    cr_assert_eq(reexec_field(&cr, "reclaim_policy"), SCHED_OTHER);
}

/* A reclaim_cpu set the kernel has no CPU of (valid syntax, CPU 1000 on a
 * 2-CPU machine): the thread runs unpinned and says so, and its io-wq
 * workers are not said to be pinned. The kernel copies the set only up to
 * its own CPU count, so it took the registration of an empty set, and the
 * verbose start message claimed "io-wq workers pinned" for workers that ran
 * on every CPU. */
Test(reclaim_placement, a_set_of_no_real_cpu_pins_no_io_wq_worker, .timeout = 90) {
    child_run cr;
    run_with("reclaim_cpu=1000,verbose=on", &cr);
    cr_assert(strstr(cr.err, "cannot pin the reclaim thread"), "no report of the failed pin: %s",
              cr.err);
    if (!uses_ring(&cr)) cr_skip_test("io_uring unavailable: no io-wq workers");
    cr_assert_null(strstr(cr.err, "io-wq workers pinned"), "workers said to be pinned: %s", cr.err);
    cpu_set_t allowed;
    cr_assert_eq(sched_getaffinity(0, sizeof allowed, &allowed), 0);
    cr_assert_eq(__builtin_popcountll(reexec_field(&cr, "worker0_cpus")), CPU_COUNT(&allowed));
}
