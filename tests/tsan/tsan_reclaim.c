/* The reclaim thread purging while request threads allocate and free, under
 * ThreadSanitizer. Purge delay 0: every slice freed is claimed and purged as
 * soon as the reclaim thread sees it, so claims race with the request
 * threads' span allocation from the same segments. Three workers keep a live
 * set of blocks (small to a few MiB, so whole spans come and go) and check
 * every block's pattern before freeing it: a purge that hit a live block
 * would show as zeros. A fourth thread keeps asking for ticks
 * (lull_reclaim_now), changes the purge delay and mode at run time, and
 * reads the statistics. */
#include "tsan_common.h"

#include <fcntl.h>

#define WORKERS 3
#define OPS 40000
#define LIVE 512

static atomic_bool stop;
static atomic_int workers_done;

static size_t pick_size(uint64_t r) {
    uint64_t k = r % 1000;
    if (k < 700) return 16 + (r >> 12) % 2048;
    if (k < 950) return 4 * KiB + (r >> 12) % (120 * KiB);
    return 256 * KiB + (r >> 12) % (3 * MiB);
}

static void *worker(void *arg) {
    int id = (int)(intptr_t)arg;
    uint64_t rng = mix64((uint64_t)id + 17);
    tsan_item *live = calloc(LIVE, sizeof *live);
    CHECK(live != NULL, "calloc");
    if (!live) return NULL;
    for (int op = 0; op < OPS; op++) {
        uint64_t r = rng_next(&rng);
        tsan_item *it = &live[r % LIVE];
        if (it->p) {
            CHECK(pat_check(it->p, it->size, it->seed),
                  "live block %p of %zu bytes changed (purged while live?)", it->p, it->size);
            lull_free(it->p);
            it->p = NULL;
        }
        /* phases: sometimes free a lot at once, so whole spans empty */
        if (op % 5000 == 4999) {
            for (int i = 0; i < LIVE; i += 2)
                if (live[i].p) {
                    CHECK(pat_check(live[i].p, live[i].size, live[i].seed), "live block changed");
                    lull_free(live[i].p);
                    live[i].p = NULL;
                }
            lull_thread_collect();
        }
        size_t size = pick_size(rng_next(&rng));
        errno = 0;
        void *p = (r >> 40) % 4 == 0 ? lull_calloc(1, size) : lull_malloc(size);
        if (!p) {
            /* seen once in CI (a 962-byte malloc, no heap limit set): what
             * lull's statistics said at that moment is the lead */
            int err = errno;
            lull_print_stats(STDERR_FILENO);
            CHECK(false, "allocation of %zu failed (errno %d, %s)", size, err, strerror(err));
            continue;
        }
        if ((r >> 40) % 4 == 0) {
            /* calloc'd memory (perhaps just purged) reads as zeros */
            const uint8_t *b = p;
            for (size_t off = 0; off < size; off += 4096)
                if (b[off]) {
                    CHECK(false, "calloc(%zu) byte %zu not zero", size, off);
                    break;
                }
        }
        *it = (tsan_item){p, size, rng_next(&rng)};
        pat_fill(p, size, it->seed);
    }
    for (int i = 0; i < LIVE; i++)
        if (live[i].p) {
            CHECK(pat_check(live[i].p, live[i].size, live[i].seed), "live block changed");
            lull_free(live[i].p);
        }
    free(live);
    atomic_fetch_add(&workers_done, 1);
    return NULL;
}

static void *reclaimer(void *arg) {
    (void)arg;
    static const long delays[] = {0, 0, 3, 0, -1, 0, -2, 0};
    static const char *const modes[] = {"dontneed", "free", "auto", "dontneed"};
    int devnull = open("/dev/null", O_WRONLY | O_CLOEXEC);
    for (unsigned i = 0; !atomic_load(&stop); i++) {
        CHECK(lull_reclaim_now(), "lull_reclaim_now() false with a reclaim thread");
        if (i % 16 == 0) lull_set_purge_delay_ms(delays[(i / 16) % 8]);
        if (i % 64 == 0) lull_configure("purge_mode", modes[(i / 64) % 4]);
        if (i % 8 == 0 && devnull >= 0) lull_print_stats(devnull);
        struct timespec t = {0, 200000};
        nanosleep(&t, NULL);
    }
    if (devnull >= 0) close(devnull);
    return NULL;
}

int main(void) {
    lull_set_purge_delay_ms(0);
    pthread_t w[WORKERS], r;
    start_thread(&r, reclaimer, NULL);
    for (int i = 0; i < WORKERS; i++)
        start_thread(&w[i], worker, (void *)(intptr_t)i);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(w[i], NULL);
    atomic_store(&stop, true);
    pthread_join(r, NULL);
    lull_configure("purge_mode", "dontneed");
    lull_set_purge_delay_ms(0);
    CHECK(lull_reclaim_now(), "no reclaim thread");
    CHECK(lull_reclaim_now(), "no reclaim thread");
    return tsan_finish("tsan_reclaim");
}
