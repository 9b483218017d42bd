/* Purge backends: probing and choice at open, the common entry point (range
 * checks, batching, dispatch), degradation, close and fork. */
#include "reclaim/purge_backend.h"
#include "base/message.h"
#include "base/os.h"
#include "base/fork_exec.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

const char *purge_backend_name(lull_backend_kind k) {
    switch (k) {
    case LULL_BACKEND_AUTO:
        return "auto";
    case LULL_BACKEND_URING:
        return "uring";
    case LULL_BACKEND_PROCESS_MADVISE:
        return "process_madvise";
    case LULL_BACKEND_MADVISE:
        return "madvise";
    }
    return "?";
}

lull_backend_kind purge_backend_kind(const purge_backend *b) {
    return b->is_open ? b->kind : LULL_BACKEND_MADVISE;
}

static const char *err_name(int err) {
    const char *s = err ? strerrorname_np(err) : NULL;
    return s ? s : "error";
}

void purge_set_reason(purge_backend *b, const char *what, int err) {
    if (err)
        snprintf(b->fallback_reason, sizeof b->fallback_reason, "%s: %s", what, err_name(err));
    else
        snprintf(b->fallback_reason, sizeof b->fallback_reason, "%s", what);
    b->fallback_errno = err;
}

void purge_degrade(purge_backend *b, lull_backend_kind k, const char *what, int err) {
    bool fd_ok = err != EBADF; /* the fd number may belong to someone else now */
    if (k == LULL_BACKEND_URING) {
        if (!b->ring_open) return;
        purge_uring_close(b, fd_ok);
    } else if (k == LULL_BACKEND_PROCESS_MADVISE) {
        if (!b->pm_ok) return;
        purge_pm_close(b, fd_ok);
    } else {
        return;
    }
    purge_count(&b->fallbacks, 1);
    if (b->kind == k) {
        b->kind = k == LULL_BACKEND_URING && b->pm_ok ? LULL_BACKEND_PROCESS_MADVISE
                                                      : LULL_BACKEND_MADVISE;
        purge_set_reason(b, what, err);
    }
    lull_message("purge backend %s given up (%s: %s); purging with %s", purge_backend_name(k), what,
                 err_name(err), purge_backend_name(b->kind));
}

size_t purge_run_below(purge_backend *b, lull_backend_kind below, const purge_range *r, size_t n,
                       int advice, int *res) {
    if (below == LULL_BACKEND_URING && b->pm_ok) return purge_pm_run(b, r, n, advice, res);
    return purge_madvise_run(b, r, n, advice, res);
}

lull_backend_kind purge_backend_open(purge_backend *b, lull_backend_kind want,
                                     const cpu_set_t *iowq_cpus) {
    memset(b, 0, sizeof *b);
    b->pidfd = -1;
    b->ring.ring_fd = -1;
    b->kind = LULL_BACKEND_MADVISE;
    b->want = want;
    b->is_open = true;
    if (want != LULL_BACKEND_URING && want != LULL_BACKEND_PROCESS_MADVISE &&
        want != LULL_BACKEND_MADVISE)
        want = LULL_BACKEND_AUTO;
    bool try_uring = want == LULL_BACKEND_AUTO || want == LULL_BACKEND_URING;
    bool try_pm = try_uring || want == LULL_BACKEND_PROCESS_MADVISE;
    if (!try_pm) return b->kind;

    /* Probes purge one touched scratch page (an empty range if none). */
    size_t ps = lull_os_page_size();
    purge_range probe = {NULL, 0};
    void *scratch = mmap(NULL, ps, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (scratch != MAP_FAILED) {
        *(volatile char *)scratch = 1;
        probe.addr = scratch;
        probe.len = ps;
    }

    const char *pm_what = NULL, *ur_what = NULL;
    int pm_err = purge_pm_open(b, &probe, &pm_what);
    int ur_err = 0;
    if (try_uring) {
        if (scratch != MAP_FAILED) *(volatile char *)scratch = 1;
        ur_err = purge_uring_open(b, iowq_cpus, &probe, &ur_what);
    }
    if (scratch != MAP_FAILED) munmap(scratch, ps);

    if (try_uring && ur_err == 0) {
        b->kind = LULL_BACKEND_URING;
    } else {
        char *s = b->fallback_reason;
        size_t len = sizeof b->fallback_reason, at = 0;
        if (try_uring) {
            at += (size_t)snprintf(s, len, "%s: %s", ur_what, err_name(-ur_err));
            b->fallback_errno = -ur_err;
            purge_count(&b->fallbacks, 1);
        }
        if (pm_err == 0) {
            b->kind = LULL_BACKEND_PROCESS_MADVISE;
        } else {
            if (at < len)
                snprintf(s + at, len - at, "%s%s: %s", at ? "; " : "", pm_what, err_name(-pm_err));
            if (!try_uring) b->fallback_errno = -pm_err;
            purge_count(&b->fallbacks, 1);
        }
    }
    /* Counters describe purges asked for, not the probes. */
    memset(b->per_kind, 0, sizeof b->per_kind);

    if (b->fallback_reason[0] && want != LULL_BACKEND_AUTO)
        lull_message("purge backend %s unavailable (%s); purging with %s", purge_backend_name(want),
                     b->fallback_reason, purge_backend_name(b->kind));
    else
        lull_verbose("purge backend: %s%s%s%s%s", purge_backend_name(b->kind),
                     b->fallback_reason[0] ? " (" : "", b->fallback_reason,
                     b->fallback_reason[0] ? ")" : "",
                     b->iowq_pinned ? ", io-wq workers pinned" : "");
    return b->kind;
}

void purge_backend_close(purge_backend *b) {
    /* Never opened (a zeroed struct has pidfd 0): touch no fd. */
    if (!b->is_open) {
        b->kind = LULL_BACKEND_MADVISE;
        return;
    }
    purge_uring_close(b, true);
    purge_pm_close(b, true);
    b->kind = LULL_BACKEND_MADVISE;
    b->is_open = false;
}

static char closed_after_fork[] LULL_FORK_EXEC_DATA = "closed after fork";
_Static_assert(sizeof closed_after_fork <= sizeof((purge_backend *)0)->fallback_reason,
               "the reason fits");

LULL_FORK_EXEC_TEXT void purge_backend_forget_after_fork(purge_backend *b) {
    /* The ring's pages are MADV_DONTFORK (not mapped here): never read or
     * unmap them, or the addresses may already hold the child's memory. The
     * pidfd names the parent: never use it. Only the fds are ours to close,
     * and only if the parent had opened the backend (a zeroed struct has
     * pidfd 0, which is stdin). */
    if (!b->is_open) {
        b->kind = LULL_BACKEND_MADVISE;
        return;
    }
    if (b->ring_open && b->ring.ring_fd >= 0) lull_close_unwrapped(b->ring.ring_fd);
    memset(&b->ring, 0, sizeof b->ring);
    b->ring.ring_fd = -1;
    b->ring_open = false;
    b->iowq_pinned = false;
    purge_pm_close(b, true);
    if (b->kind != LULL_BACKEND_MADVISE) {
        /* purge_set_reason()'s copy, from this page, not .rodata's (a
         * page of the child's for 18 bytes) */
        memcpy(b->fallback_reason, closed_after_fork, sizeof closed_after_fork);
        b->fallback_errno = 0;
    }
    b->kind = LULL_BACKEND_MADVISE;
    b->is_open = false;
}

size_t purge_backend_run(purge_backend *b, const purge_range *r, size_t n, int advice,
                         int *results) {
    const uintptr_t page_mask = lull_os_page_size() - 1;
    size_t ok = 0;
    purge_count(&b->runs, 1);
    b->not_purging = advice != MADV_DONTNEED && advice != MADV_FREE;
    for (size_t base = 0; base < n; base += PURGE_RING_ENTRIES) {
        size_t m = n - base < PURGE_RING_ENTRIES ? n - base : PURGE_RING_ENTRIES;
        purge_range sub[PURGE_RING_ENTRIES];
        uint16_t at[PURGE_RING_ENTRIES];
        int res[PURGE_RING_ENTRIES], sres[PURGE_RING_ENTRIES];
        size_t k = 0;
        for (size_t j = 0; j < m; j++) {
            const purge_range *x = &r[base + j];
            if ((uintptr_t)x->addr & page_mask) {
                res[j] = -EINVAL;
            } else if (x->len == 0) {
                res[j] = 0; /* as madvise(addr, 0) */
            } else if (x->len > PURGE_RANGE_MAX) {
                res[j] = purge_madvise_one(b, x, advice); /* caller should split */
            } else {
                sub[k] = *x;
                at[k++] = (uint16_t)j;
            }
        }
        if (k) {
            if (!b->is_open)
                purge_madvise_run(b, sub, k, advice, sres);
            else if (b->kind == LULL_BACKEND_URING && b->ring_open)
                purge_uring_run(b, sub, k, advice, sres);
            else if (b->kind == LULL_BACKEND_PROCESS_MADVISE && b->pm_ok)
                purge_pm_run(b, sub, k, advice, sres);
            else
                purge_madvise_run(b, sub, k, advice, sres);
            for (size_t i = 0; i < k; i++)
                res[at[i]] = sres[i];
        }
        size_t bad = 0;
        for (size_t j = 0; j < m; j++) {
            if (res[j] == 0)
                ok++;
            else
                bad++;
            if (results) results[base + j] = res[j];
        }
        /* errors of purges only: a prefault the kernel refuses (no
         * MADV_POPULATE_WRITE before 5.14) purges nothing, and counted, it
         * read as a purge error every tick (tests/test_prefault_errors.c) */
        if (!b->not_purging) purge_count(&b->errors, bad);
    }
    return ok;
}
