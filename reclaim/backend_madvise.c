/* Purge backend: plain madvise(2), one call per range. The last resort, so
 * it has no failure mode of its own: a range it cannot purge is a bad range. */
#include "reclaim/purge_backend.h"
#include "base/fault.h"

#include <errno.h>
#include <sys/mman.h>

/* madvise(2), or its failure with ENOMEM, errno included, when a test
 * asks for one (LULL_FAULT purge_nomem). */
static int advise(const purge_range *r, int advice) {
    if (lull_fault(LULL_FAULT_PURGE_NOMEM)) {
        errno = ENOMEM;
        return -1;
    }
    return madvise(r->addr, r->len, advice);
}

int purge_madvise_one(purge_backend *b, const purge_range *r, int advice) {
    purge_kind_counters *c = &b->per_kind[LULL_BACKEND_MADVISE];
    for (int tries = 0;; tries++) {
        purge_count_syscall(b, &c->calls);
        if (advise(r, advice) == 0) {
            purge_count_done(b, LULL_BACKEND_MADVISE, 1, r->len);
            return 0;
        }
        int e = errno;
        if ((e == EAGAIN || e == EINTR) && tries < 4) continue;
        return -e;
    }
}

size_t purge_madvise_run(purge_backend *b, const purge_range *r, size_t n, int advice, int *res) {
    size_t ok = 0;
    for (size_t i = 0; i < n; i++) {
        res[i] = purge_madvise_one(b, &r[i], advice);
        ok += res[i] == 0;
    }
    return ok;
}
