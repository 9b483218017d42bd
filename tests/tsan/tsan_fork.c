/* fork() from a multi-threaded process under ThreadSanitizer: while three
 * threads allocate and free (remote frees included) and the reclaim thread
 * purges at once, the main thread forks. Each child checks the blocks it
 * inherited from the main thread, allocates and frees small, large and huge
 * blocks, frees a block one of the parent's other threads owned, makes its
 * own reclaim thread tick, and exits 0. The parent's threads keep working
 * throughout; a child that does not finish within a minute counts as hung.
 * (The child starts a thread after a multi-threaded fork: TSan must run
 * with die_after_fork=0, as ctest sets it.) */
#include "tsan_common.h"

#include <signal.h>
#include <sys/wait.h>

#define WORKERS 3
/* 4 (was 12): tests/test_fork.c, which forks 20 times while threads allocate
 * and the reclaim thread purges, runs under TSan too now */
#define FORKS 4
#define MAIN_BLOCKS 64

static atomic_bool stop;
static spsc handoff[WORKERS];
/* one block of each worker, replaced now and then, for a child to free */
static _Atomic(void *) shared_block[WORKERS];
static atomic_ulong worker_ops;

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 1000;
    if (k < 800) return 8 + (r >> 12) % 1024;
    if (k < 995) return 2 * KiB + (r >> 12) % (300 * KiB);
    return 1 * MiB + (r >> 12) % (3 * MiB);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    spsc *out = &handoff[id], *in = &handoff[(id + 1) % WORKERS];
    uint64_t rng = mix64((uint64_t)id + 77);
    tsan_item live[128] = {{0}};
    while (!atomic_load(&stop)) {
        uint64_t r = rng_next(&rng);
        tsan_item *it = &live[r % 128];
        if (it->p) {
            CHECK(pat_check(it->p, it->size, it->seed), "block changed in the parent");
            if ((r >> 33) % 4 != 0 || !spsc_push(out, *it)) lull_free(it->p);
        }
        size_t size = pick_size(rng_next(&rng));
        *it = (tsan_item){lull_malloc(size), size, rng_next(&rng)};
        CHECK(it->p != NULL, "malloc(%zu)", size);
        if (it->p) pat_fill(it->p, size, it->seed);
        tsan_item got;
        while (spsc_pop(in, &got)) {
            CHECK(pat_check(got.p, got.size, got.seed), "handed-over block changed");
            lull_free(got.p);
        }
        if ((r >> 20) % 512 == 0) {
            void *b = lull_malloc(100);
            if (b) memset(b, 0x5a, 100);
            void *old = atomic_exchange(&shared_block[id], b);
            if (old) lull_free(old);
        }
        atomic_fetch_add_explicit(&worker_ops, 1, memory_order_relaxed);
    }
    for (int i = 0; i < 128; i++)
        if (live[i].p) lull_free(live[i].p);
    atomic_store_explicit(&out->closed, true, memory_order_release);
    while (!atomic_load_explicit(&in->closed, memory_order_acquire))
        sched_yield();
    tsan_item got;
    while (spsc_pop(in, &got))
        lull_free(got.p);
    return NULL;
}

/* Exit codes of a child, so the parent can say what went wrong. */
enum { CHILD_OK = 0, CHILD_INHERITED = 10, CHILD_ALLOC, CHILD_PATTERN, CHILD_RECLAIM };

static int child_main(tsan_item *mine) {
    for (int i = 0; i < MAIN_BLOCKS; i++)
        if (!pat_check(mine[i].p, mine[i].size, mine[i].seed)) return CHILD_INHERITED;
    /* free half of the inherited blocks, and a block of another thread */
    for (int i = 0; i < MAIN_BLOCKS; i += 2)
        lull_free(mine[i].p);
    void *other = atomic_load(&shared_block[getpid() % WORKERS]);
    if (other) lull_free(other);
    uint64_t rng = (uint64_t)getpid();
    static const size_t sizes[] = {24, 700, 5000, 100 * KiB, 700 * KiB, 3 * MiB, 20 * MiB};
    for (int round = 0; round < 20; round++)
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t size = sizes[k];
            void *p = lull_malloc(size);
            if (!p) return CHILD_ALLOC;
            uint64_t seed = rng_next(&rng);
            pat_fill(p, size, seed);
            if (!pat_check(p, size, seed)) return CHILD_PATTERN;
            lull_free(p);
        }
    if (!lull_reclaim_now()) return CHILD_RECLAIM;
    for (int i = 1; i < MAIN_BLOCKS; i += 2)
        if (!pat_check(mine[i].p, mine[i].size, mine[i].seed)) return CHILD_INHERITED;
    return CHILD_OK;
}

/* waitpid with a deadline; kills the child when it passes. */
static int wait_child(pid_t pid, int timeout_s, bool *hung) {
    int status = 0;
    for (int i = 0; i < timeout_s * 100; i++) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid) {
            *hung = false;
            return status;
        }
        struct timespec t = {0, 10000000};
        nanosleep(&t, NULL);
    }
    *hung = true;
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
    return status;
}

int main(void) {
    lull_set_purge_delay_ms(0);
    tsan_item mine[MAIN_BLOCKS];
    uint64_t rng = 4242;
    for (int i = 0; i < MAIN_BLOCKS; i++) {
        size_t size = pick_size(rng_next(&rng));
        mine[i] = (tsan_item){lull_malloc(size), size, rng_next(&rng)};
        if (!mine[i].p) {
            fprintf(stderr, "malloc failed\n");
            return 1;
        }
        pat_fill(mine[i].p, size, mine[i].seed);
    }
    pthread_t w[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        start_thread(&w[i], worker, (void *)(intptr_t)i);
    for (int f = 0; f < FORKS; f++) {
        /* let the workers get going between forks */
        unsigned long ops = atomic_load(&worker_ops);
        for (int i = 0; i < 200 && atomic_load(&worker_ops) < ops + 500; i++) {
            struct timespec t = {0, 5000000};
            nanosleep(&t, NULL);
        }
        fflush(NULL);
        pid_t pid = fork();
        if (pid < 0) {
            CHECK(false, "fork: %s", strerror(errno));
            break;
        }
        if (pid == 0) _exit(child_main(mine));
        bool hung;
        int status = wait_child(pid, 120, &hung);
        CHECK(!hung, "child %d of round %d hung (deadlock after fork?)", (int)pid, f);
        if (!hung) {
            CHECK(WIFEXITED(status), "child of round %d died of signal %d", f,
                  WIFSIGNALED(status) ? WTERMSIG(status) : 0);
            CHECK(!WIFEXITED(status) || WEXITSTATUS(status) == 0,
                  "child of round %d exited %d (10 inherited blocks changed, 11 malloc failed, "
                  "12 pattern, 13 no reclaim thread, 66 TSan report)",
                  f, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
        }
        /* the parent keeps working: its own allocations still succeed */
        void *p = lull_malloc(1000);
        CHECK(p != NULL, "parent malloc after fork");
        lull_free(p);
    }
    atomic_store(&stop, true);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(w[i], NULL);
    for (int i = 0; i < MAIN_BLOCKS; i++) {
        CHECK(pat_check(mine[i].p, mine[i].size, mine[i].seed), "parent block changed");
        lull_free(mine[i].p);
    }
    for (int i = 0; i < WORKERS; i++) {
        void *b = atomic_exchange(&shared_block[i], NULL);
        if (b) lull_free(b);
    }
    CHECK(lull_reclaim_now(), "no reclaim thread in the parent");
    return tsan_finish("tsan_fork");
}
