/* Fault-injection switches; see fault.h. */
#include "base/fault.h"

#include <stdlib.h>
#include <string.h>

_Atomic int lull_fault_armed[LULL_FAULT_COUNT];

static const char *const fault_names[LULL_FAULT_COUNT] = {
    "mmap",         "uring_setup", "uring_submit",  "uring_cqe", "process_madvise", "uffd",
    "pagemap_scan", "shm_open",    "thread_create", "numa",      "collapse",
};

void lull_fault_arm(lull_fault_point p, int n) {
    if (p < LULL_FAULT_COUNT) atomic_store(&lull_fault_armed[p], n);
}

void lull_fault_parse(const char *spec) {
    while (spec && *spec) {
        size_t len = strcspn(spec, ",");
        for (int p = 0; p < LULL_FAULT_COUNT; p++) {
            size_t nl = strlen(fault_names[p]);
            if (len >= nl && strncmp(spec, fault_names[p], nl) == 0 &&
                (spec[nl] == ',' || spec[nl] == ':' || spec[nl] == '\0')) {
                int n = spec[nl] == ':' ? atoi(spec + nl + 1) : -1;
                lull_fault_arm((lull_fault_point)p, n);
            }
        }
        spec += len;
        if (*spec == ',') spec++;
    }
}
