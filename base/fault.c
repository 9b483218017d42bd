/* Fault-injection switches; see fault.h. */
#include "base/fault.h"
#include "base/message.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

_Atomic int lull_fault_armed[LULL_FAULT_COUNT];

static const char *const fault_names[LULL_FAULT_COUNT] = {
    "mmap",     "uring_setup",  "uring_submit",    "uring_cqe",     "process_madvise",
    "uffd",     "pagemap_scan", "shm_open",        "thread_create", "numa",
    "collapse", "purge_nomem",  "uring_no_worker",
};

void lull_fault_arm(lull_fault_point p, int n) {
    if (p < LULL_FAULT_COUNT) atomic_store(&lull_fault_armed[p], n);
}

/* The count after "name:", up to the item's end at `end`; false if it is
 * not a whole number from -1 up. */
static bool parse_count(const char *s, const char *end, int *out) {
    char *stop;
    long n = strtol(s, &stop, 10);
    if (stop == s || stop != end || n < -1 || n > INT_MAX) return false;
    *out = (int)n;
    return true;
}

/* One message for an item of LULL_FAULT that arms nothing. */
static void report_unknown(const char *item, size_t len) {
    char names[160];
    size_t at = 0;
    for (int p = 0; p < LULL_FAULT_COUNT; p++) {
        size_t nl = strlen(fault_names[p]);
        if (at + nl + 3 > sizeof names) break;
        if (p) {
            names[at++] = ',';
            names[at++] = ' ';
        }
        memcpy(names + at, fault_names[p], nl);
        at += nl;
    }
    names[at] = '\0';
    lull_message("LULL_FAULT: '%.*s' ignored (points: %s; a count after ':' is -1 or more)",
                 (int)(len < 64 ? len : 64), item, names);
}

void lull_fault_parse(const char *spec) {
    while (spec && *spec) {
        size_t len = strcspn(spec, ",");
        bool known = len == 0; /* ",," is no item */
        for (int p = 0; p < LULL_FAULT_COUNT && !known; p++) {
            size_t nl = strlen(fault_names[p]);
            if (len >= nl && strncmp(spec, fault_names[p], nl) == 0 &&
                (spec[nl] == ',' || spec[nl] == ':' || spec[nl] == '\0')) {
                int n = -1;
                known = spec[nl] != ':' || parse_count(spec + nl + 1, spec + len, &n);
                if (known) lull_fault_arm((lull_fault_point)p, n);
            }
        }
        /* a test hook, read once at start: a misspelt name armed nothing,
         * and the test it was for passed for the wrong reason. Reported,
         * as a bad configuration value is (docs/configuration.md) */
        if (!known) report_unknown(spec, len);
        spec += len;
        if (*spec == ',') spec++;
    }
}
