/* The sampled heap profile's records: the stacks of sampled allocations
 * with their estimates, the sampled blocks still live, the peak, and
 * lull_profile_dump() (see profile.h for the sampling).
 *
 * Estimates: an allocation of a block of b bytes is sampled with
 * probability p = 1 - exp(-b / interval) (a Poisson process over the bytes
 * handed out), so each sample counts 1/p allocations and size/p bytes
 * asked for: unbiased, as in tcmalloc and jemalloc.
 *
 * The peak: the live figures of every stack are copied into its peak
 * figures whenever the live total passes the last peak by 1/16, so the
 * peak profile is one taken within 1/16 of the real peak, at the cost of
 * a copy only each time the heap grows by that much.
 *
 * Everything is under one lock, taken only by sampled allocations, their
 * frees and the dump: at the default interval a few times per MiB
 * allocated. The tables are mapped at the first sample and never freed;
 * when one is full, further samples are counted as dropped. A thread
 * inside the profile (taking a stack, dumping) records nothing, so that an
 * allocation made there cannot wait for the lock it holds. */
#define _GNU_SOURCE
#include "src/profile.h"
#include "base/no_cancel.h"
#include "src/profile_math.h"
#include "base/config.h"
#include "base/module.h"
#include "base/fork_exec.h"
#include "src/entry_text.h"
#include "src/pprof_write.h"
#include "src/profile_stack.h"
#include "lull.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

_Atomic uint64_t lull_profile_interval;
__thread uintptr_t lull_profile_boundary __attribute__((tls_model("initial-exec")));
static __thread bool tl_in_profile __attribute__((tls_model("initial-exec")));

#define MAX_STACKS 8192
#define STACK_SLOTS (2 * MAX_STACKS) /* open addressing, a power of two */
#define SAMPLE_SLOTS (1u << 17)      /* sampled blocks live at once, at most half full */

typedef struct {
    uint64_t hash;
    uint32_t depth;
    uintptr_t pc[LULL_PROFILE_MAX_DEPTH];
    double alloc_objects, alloc_space, live_objects, live_space, peak_objects, peak_space;
} stack_record;

typedef struct {
    uintptr_t addr; /* 0: empty */
    uint32_t stack;
    double objects, space;
} sample_slot;

/* fork holds it; with the other locks a fork child resets (base/fork_exec.h) */
static LULL_FORK_EXEC_DATA pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static stack_record *stacks;  /* MAX_STACKS */
static uint32_t *stack_index; /* STACK_SLOTS: 1 + index into stacks, or 0 */
static sample_slot *samples;  /* SAMPLE_SLOTS */
static uint32_t nstacks, nsamples;
static double live_total, peak_total;
static uint64_t dropped;

static void *map_zeroed(size_t len) {
    void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Under the lock: the tables, at the first sample. All or none: a sample
 * that finds no memory for one of them (an address space limit) is
 * dropped and unmaps the others, and the next sample asks again. Kept
 * mapped and mapped anew at the next sample, the first two leaked 2.6 MiB
 * a dropped sample while the limit left room for them
 * (tests/test_profile_tables_enomem.c). */
static bool tables_ready(void) {
    if (samples) return true;
    const size_t stacks_len = MAX_STACKS * sizeof *stacks;
    const size_t index_len = STACK_SLOTS * sizeof *stack_index;
    const size_t samples_len = SAMPLE_SLOTS * sizeof *samples;
    stack_record *st = map_zeroed(stacks_len);
    uint32_t *index = map_zeroed(index_len);
    sample_slot *s = map_zeroed(samples_len);
    if (!st || !index || !s) {
        if (st) munmap(st, stacks_len);
        if (index) munmap(index, index_len);
        if (s) munmap(s, samples_len);
        return false;
    }
    stacks = st;
    stack_index = index;
    samples = s;
    return true;
}

/* ---- stacks ----------------------------------------------------------- */

static uint64_t stack_hash(const uintptr_t *pc, uint32_t depth) {
    uint64_t h = 0xcbf29ce484222325ULL ^ depth;
    for (uint32_t i = 0; i < depth; i++) {
        h ^= pc[i];
        h *= 0x100000001b3ULL;
        h ^= h >> 29;
    }
    return h;
}

static bool same_stack(const uintptr_t *pc, const uintptr_t *ra, uint32_t depth) {
    for (uint32_t d = 0; d < depth; d++)
        if (pc[d] != ra[d] - 1) return false;
    return true;
}

/* Under the lock: the stack's record, added if new; UINT32_MAX when the
 * table is full. */
static uint32_t stack_intern(const lull_stack *w) {
    uint64_t h = stack_hash(w->ra, w->depth);
    for (uint32_t i = (uint32_t)h & (STACK_SLOTS - 1);; i = (i + 1) & (STACK_SLOTS - 1)) {
        uint32_t k = stack_index[i];
        if (!k) {
            if (nstacks == MAX_STACKS) return UINT32_MAX;
            stack_record *r = &stacks[nstacks];
            r->hash = h;
            r->depth = w->depth;
            /* a return address less one: inside the call, whose line it is */
            for (uint32_t d = 0; d < w->depth; d++)
                r->pc[d] = w->ra[d] - 1;
            stack_index[i] = ++nstacks;
            return nstacks - 1;
        }
        stack_record *r = &stacks[k - 1];
        if (r->hash == h && r->depth == w->depth && same_stack(r->pc, w->ra, w->depth))
            return k - 1;
    }
}

/* ---- sampled blocks: linear probing, deletion by backward shift ------- */

static uint32_t slot_of(uintptr_t addr) {
    uint64_t h = (uint64_t)addr * 0x9e3779b97f4a7c15ULL;
    return (uint32_t)(h >> 40) & (SAMPLE_SLOTS - 1);
}

static sample_slot *sample_find(uintptr_t addr) {
    for (uint32_t i = slot_of(addr);; i = (i + 1) & (SAMPLE_SLOTS - 1)) {
        if (samples[i].addr == addr) return &samples[i];
        if (!samples[i].addr) return NULL;
    }
}

static void sample_remove(sample_slot *gone) {
    uint32_t i = (uint32_t)(gone - samples);
    for (uint32_t j = (i + 1) & (SAMPLE_SLOTS - 1); samples[j].addr;
         j = (j + 1) & (SAMPLE_SLOTS - 1)) {
        uint32_t home = slot_of(samples[j].addr);
        /* j's entry may move into the hole at i if its home is not in (i, j] */
        if ((j > i && (home <= i || home > j)) || (j < i && home <= i && home > j)) {
            samples[i] = samples[j];
            i = j;
        }
    }
    samples[i].addr = 0;
    nsamples--;
}

/* ---- recording -------------------------------------------------------- */

static void note_peak(void) {
    if (live_total <= peak_total * (1.0 + 1.0 / 16)) return;
    for (uint32_t i = 0; i < nstacks; i++) {
        stacks[i].peak_objects = stacks[i].live_objects;
        stacks[i].peak_space = stacks[i].live_space;
    }
    peak_total = live_total;
}

void lull_profile_sampled(const void *p, size_t size, size_t sampled_bytes) {
    if (tl_in_profile) return;
    tl_in_profile = true;
    /* lull's frames: those below the entry's slow path (a frame's stack
     * pointer at its call is below the boundary for the slow path's callees
     * and itself, equal for its caller), and the entry points'
     * (src/entry_text.h) */
    lull_stack w; /* not zeroed: its frames are written up to its depth */
    w.below = lull_profile_boundary;
    w.skip_from = (uintptr_t)__start_lull_entry_text;
    w.skip_to = (uintptr_t)__stop_lull_entry_text;
    double prob =
        lull_one_minus_exp_neg((double)sampled_bytes / (double)lull_profile_interval_now());
    double objects = prob > 0 ? 1.0 / prob : 1.0;
    /* outside the lock: the walk may read the unwind tables */
    lull_stack_take(&w);
    pthread_mutex_lock(&lock);
    uint32_t k = tables_ready() && nsamples < SAMPLE_SLOTS / 2 ? stack_intern(&w) : UINT32_MAX;
    if (k == UINT32_MAX) {
        dropped++;
        goto out;
    }
    stack_record *r = &stacks[k];
    double space = objects * (double)size;
    r->alloc_objects += objects;
    r->alloc_space += space;
    r->live_objects += objects;
    r->live_space += space;
    live_total += space;
    uint32_t i = slot_of((uintptr_t)p);
    while (samples[i].addr)
        i = (i + 1) & (SAMPLE_SLOTS - 1);
    samples[i] =
        (sample_slot){.addr = (uintptr_t)p, .stack = k, .objects = objects, .space = space};
    nsamples++;
    note_peak();
out:
    pthread_mutex_unlock(&lock);
    tl_in_profile = false;
}

void lull_profile_forget(const void *p) {
    pthread_mutex_lock(&lock);
    sample_slot *s = samples ? sample_find((uintptr_t)p) : NULL;
    if (s) {
        stack_record *r = &stacks[s->stack];
        r->live_objects -= s->objects;
        r->live_space -= s->space;
        live_total -= s->space;
        sample_remove(s);
    }
    pthread_mutex_unlock(&lock);
}

void lull_profile_resized(const void *p, size_t size) {
    pthread_mutex_lock(&lock);
    sample_slot *s = samples ? sample_find((uintptr_t)p) : NULL;
    if (s) {
        double space = s->objects * (double)size;
        stack_record *r = &stacks[s->stack];
        r->live_space += space - s->space;
        live_total += space - s->space;
        s->space = space;
        note_peak();
    }
    pthread_mutex_unlock(&lock);
}

/* ---- the dump --------------------------------------------------------- */

static int64_t rounded(double x) {
    return x <= 0 ? 0 : (int64_t)(x + 0.5);
}

/* A new file of the dump's own next to path (O_EXCL, mode 0600 whatever
 * the umask), its name into tmp: the descriptor, or -1 with errno. */
static int create_beside(const char *path, char *tmp, size_t cap) {
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path) + 1 : 0;
    if (snprintf(tmp, cap, "%.*s.lull-profile-XXXXXX", dir_len, path) >= (int)cap) {
        errno = ENAMETOOLONG;
        return -1;
    }
    int fd = mkostemp(tmp, O_CLOEXEC);
    if (fd >= 0 && fchmod(fd, 0600) != 0) {
        int err = errno;
        close(fd);
        unlink(tmp);
        errno = err;
        return -1;
    }
    return fd;
}

/* The profile is written into a file of its own and renamed over path
 * once whole, so path is never opened: a dump that fails (a full disk,
 * RLIMIT_FSIZE) leaves what path held (opened with O_TRUNC, it was left
 * with the first bytes of the new profile), a hard link at path loses
 * only that name (its other file was overwritten), and a symbolic link
 * there is replaced, never followed (tests/test_profile_dump_file.c). */
static int dump(const char *path) {
    char tmp[PATH_MAX];
    int fd = create_beside(path, tmp, sizeof tmp);
    if (fd < 0) return -1;
    bool was_inside = tl_in_profile;
    tl_in_profile = true;
    pthread_mutex_lock(&lock);
    size_t n = nstacks, len = (n ? n : 1) * sizeof(lull_profile_record);
    lull_profile_record *out = map_zeroed(len);
    if (out)
        for (size_t i = 0; i < n; i++) {
            const stack_record *r = &stacks[i];
            out[i].depth = r->depth;
            memcpy(out[i].pc, r->pc, r->depth * sizeof r->pc[0]);
            out[i].alloc_objects = rounded(r->alloc_objects);
            out[i].alloc_space = rounded(r->alloc_space);
            out[i].inuse_objects = rounded(r->live_objects);
            out[i].inuse_space = rounded(r->live_space);
            out[i].peak_objects = rounded(r->peak_objects);
            out[i].peak_space = rounded(r->peak_space);
        }
    pthread_mutex_unlock(&lock);
    int rc = -1, err = ENOMEM;
    if (out) {
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        rc = lull_pprof_write(fd, out, n, (int64_t)lull_profile_interval_now(),
                              (int64_t)now.tv_sec * 1000000000 + now.tv_nsec);
        err = errno;
        munmap(out, len);
    }
    if (close(fd) != 0 && rc == 0) {
        rc = -1;
        err = errno;
    }
    if (rc == 0 && rename(tmp, path) != 0) {
        rc = -1;
        err = errno;
    }
    if (rc != 0) unlink(tmp);
    tl_in_profile = was_inside;
    if (rc != 0) errno = err;
    return rc;
}

/* open, write and close are cancellation points: a cancelled caller left
 * the descriptor open and the copy mapped (base/no_cancel.h) */
int lull_profile_dump(const char *path) {
    lull_modules_ensure_started(); /* a process that has not allocated through lull yet */
    if (!lull_profile_interval_now() || !path) {
        errno = EINVAL;
        return -1;
    }
    int cancel = lull_cancel_off();
    int rc = dump(path);
    int err = errno;
    lull_cancel_restore(cancel);
    errno = err;
    return rc;
}

/* ---- start and fork --------------------------------------------------- */

/* The walks end first: a walk may free a sampled block (glibc's
 * pthread_getattr_np frees its cpu set), whose lull_profile_forget takes
 * the lock; holding it while waiting for the walks deadlocked. */
static void fork_prepare(void) {
    lull_stack_fork_prepare();
    pthread_mutex_lock(&lock);
}

static void fork_parent(void) {
    pthread_mutex_unlock(&lock);
    lull_stack_fork_parent();
}

LULL_FORK_EXEC_TEXT static void fork_child(void) {
    lull_stack_fork_child();
    lull_mutex_reset_in_child(&lock);
}

LULL_FORK_EXEC_TEXT void lull_profile_register(void) {
    static const lull_module_hooks hooks = {
        .fork_prepare = fork_prepare,
        .fork_parent = fork_parent,
        .fork_child = fork_child,
    };
    lull_register_module(&hooks);
}
