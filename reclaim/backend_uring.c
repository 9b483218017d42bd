/* Purge backend: io_uring IORING_OP_MADVISE, one SQE per range.
 *
 * The kernel always runs the madvise in an io-wq worker of the submitting
 * thread (IOSQE_ASYNC skips the inline attempt that would only answer
 * -EAGAIN), so the ring belongs to the reclaim thread (SINGLE_ISSUER) and
 * its workers may be pinned to the reclaim CPUs.
 *
 * A batch never returns with a request in flight: a late MADV_DONTNEED on a
 * range the allocator has handed out again would zero live blocks. */
#include "reclaim/purge_backend.h"
#include "base/fault.h"
#include "base/message.h"
#include "base/race.h"

#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

/* Copy the completions that are ready into res[]; returns how many. */
static unsigned reap(purge_backend *b, const purge_range *r, size_t n, int *res) {
    struct io_uring_cqe *cqe;
    unsigned head, seen = 0;
    io_uring_for_each_cqe(&b->ring, head, cqe) {
        uint64_t i = io_uring_cqe_get_data64(cqe);
        int v = cqe->res;
        if (lull_fault(LULL_FAULT_URING_CQE)) v = -EOPNOTSUPP;
        if (v == 0 && lull_fault(LULL_FAULT_PURGE_NOMEM)) v = -ENOMEM;
        if (v == 0 && lull_fault(LULL_FAULT_URING_NO_WORKER)) v = -ECANCELED;
        if (i < n) {
            res[i] = v;
            if (v == 0) purge_count_done(b, LULL_BACKEND_URING, 1, r[i].len);
        }
        seen++;
    }
    io_uring_cq_advance(&b->ring, seen);
    return seen;
}

/* Submit n <= PURGE_RING_ENTRIES madvise SQEs and wait for every request
 * the kernel took. res[i] gets the completion's result, or stays
 * PURGE_PENDING if the request was never submitted. Returns 0, or the
 * -errno with which submission failed. */
static int uring_batch(purge_backend *b, const purge_range *r, size_t n, int advice, int *res) {
    struct io_uring *ring = &b->ring;
    uint64_t *calls = &b->per_kind[LULL_BACKEND_URING].calls;
    size_t queued = 0;
    for (size_t i = 0; i < n; i++)
        res[i] = PURGE_PENDING;
    for (; queued < n; queued++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(ring);
        if (!sqe) break; /* cannot happen: the SQ is empty between batches */
        io_uring_prep_madvise(sqe, r[queued].addr, (off_t)r[queued].len, advice);
        sqe->flags |= IOSQE_ASYNC;
        io_uring_sqe_set_data64(sqe, queued);
    }

    size_t submitted = 0, inflight = 0;
    int err = 0, tries = 0;
    while (submitted < queued) {
        int ret;
        if (lull_fault(LULL_FAULT_URING_SUBMIT)) {
            ret = -ENXIO;
        } else {
            purge_count_syscall(b, calls);
            /* wait for every request not yet reaped */
            ret = io_uring_submit_and_wait(ring, (unsigned)(inflight + queued - submitted));
        }
        if (ret > 0) {
            submitted += (size_t)ret;
            inflight += (size_t)ret;
            tries = 0;
            continue;
        }
        if ((ret == 0 || ret == -EINTR || ret == -EAGAIN || ret == -EBUSY) && ++tries < 8) {
            inflight -= reap(b, r, n, res);
            continue;
        }
        err = ret ? ret : -EIO;
        break;
    }

    while (inflight) {
        inflight -= reap(b, r, n, res);
        if (!inflight) break;
        struct io_uring_cqe *cqe;
        purge_count_syscall(b, calls);
        int w = io_uring_wait_cqe(ring, &cqe);
        if (w < 0 && !purge_err_transient(w) && w != -ETIME) {
            /* The ring cannot be waited on, but io-wq still posts the
             * completions into the shared CQ ring: poll it. */
            struct timespec ts = {0, 100000};
            nanosleep(&ts, NULL);
        }
    }
    return err;
}

int purge_uring_open(purge_backend *b, const cpu_set_t *iowq_cpus, const purge_range *probe,
                     const char **what) {
    /* Newest flags first; SINGLE_ISSUER needs 6.0, SUBMIT_ALL 5.18. */
    static const unsigned flag_sets[] = {IORING_SETUP_SINGLE_ISSUER | IORING_SETUP_SUBMIT_ALL,
                                         IORING_SETUP_SUBMIT_ALL, 0};
    int ret = -EINVAL;
    *what = "io_uring_setup";
    if (lull_fault(LULL_FAULT_URING_SETUP)) return -EPERM; /* as io_uring_disabled=2 */
    for (size_t i = 0; i < sizeof flag_sets / sizeof flag_sets[0] && ret == -EINVAL; i++) {
        struct io_uring_params p;
        memset(&p, 0, sizeof p);
        p.flags = flag_sets[i];
        ret = io_uring_queue_init_params(PURGE_RING_ENTRIES, &b->ring, &p);
        if (ret == 0) b->ring_flags = p.flags;
    }
    if (ret < 0) {
        memset(&b->ring, 0, sizeof b->ring);
        b->ring.ring_fd = -1;
        return ret;
    }
    /* the ring's descriptor is open, and a fork child, which closes it
     * only when ring_open says so, would keep it: the reclaim thread opens
     * its backend under the step lock, which fork's prepare handler takes */
    LULL_RACE_POINT(LULL_RACE_RECLAIM_OPEN);
    b->ring_open = true;
    if (b->ring.sq.ring_entries < PURGE_RING_ENTRIES) { /* cannot happen: asked for exactly that */
        purge_uring_close(b, true);
        *what = "io_uring ring too small";
        return -ENOSPC;
    }
    /* A child of fork() must never share the parent's rings. */
    if (io_uring_ring_dontfork(&b->ring) < 0)
        lull_verbose("io_uring: MADV_DONTFORK on the ring failed");
    /* Enter through a registered ring index: cheaper, and immune to the
     * program closing or reusing the fd number. Optional (5.18+). */
    (void)io_uring_register_ring_fd(&b->ring);

    if (iowq_cpus) {
        int e = CPU_COUNT(iowq_cpus) == 0
                    ? -EINVAL
                    : io_uring_register_iowq_aff(&b->ring, sizeof *iowq_cpus, iowq_cpus);
        b->iowq_aff_err = e;
        b->iowq_pinned = e == 0;
        if (e < 0)
            lull_message("io_uring: io-wq workers not pinned to the reclaim CPUs (%s%s)",
                         strerrorname_np(-e) ? strerrorname_np(-e) : "error",
                         CPU_COUNT(iowq_cpus) == 0 ? ", empty CPU set" : "");
    }

    /* One real request: proves the op works here (and starts the worker). */
    int res = PURGE_PENDING;
    int e = uring_batch(b, probe, 1, MADV_DONTNEED, &res);
    if (e == 0 && res != 0) e = res == PURGE_PENDING ? -EIO : res;
    if (e < 0) {
        purge_uring_close(b, e != -EBADF);
        *what = "io_uring madvise probe";
        return e;
    }
    return 0;
}

void purge_uring_close(purge_backend *b, bool fd_ok) {
    if (!b->ring_open) return;
    if (fd_ok) io_uring_queue_exit(&b->ring);
    memset(&b->ring, 0, sizeof b->ring);
    b->ring.ring_fd = -1;
    b->ring_open = false;
    b->iowq_pinned = false;
}

size_t purge_uring_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res) {
    int err = uring_batch(b, r, n, advice, res);
    if (err < 0) purge_degrade(b, LULL_BACKEND_URING, "io_uring submit failed at run time", -err);

    /* Redo on the next mechanism whatever did not succeed: never submitted,
     * or failed. A range that fails there too is a bad range; one that
     * succeeds there shows io_uring at fault. */
    purge_range redo[PURGE_RING_ENTRIES];
    uint16_t at[PURGE_RING_ENTRIES];
    int rres[PURGE_RING_ENTRIES];
    size_t m = 0, ok = 0;
    for (size_t i = 0; i < n; i++) {
        if (res[i] == 0) {
            ok++;
        } else {
            redo[m] = r[i];
            at[m++] = (uint16_t)i;
        }
    }
    if (m == 0) return ok;
    purge_count(&b->redone, m);
    purge_run_below(b, LULL_BACKEND_URING, redo, m, advice, rres);
    int blame = 0;
    for (size_t j = 0; j < m; j++) {
        int was = res[at[j]];
        if (was < 0 && rres[j] == 0 && purge_err_blames_mechanism(was)) blame = was;
        res[at[j]] = rres[j];
        ok += rres[j] == 0;
    }
    if (blame && b->ring_open)
        purge_degrade(b, LULL_BACKEND_URING, "io_uring madvise failed at run time", -blame);
    return ok;
}
