/* Milliseconds for the tests' waits and deadlines: a monotonic clock and a
 * sleep that resumes after a signal. Header-only (static inline), no
 * Criterion, usable in re-executed children before Criterion starts. */
#ifndef LULL_TEST_TIMING_H
#define LULL_TEST_TIMING_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

/* CLOCK_MONOTONIC in milliseconds. */
static inline uint64_t now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000 + (uint64_t)t.tv_nsec / 1000000;
}

/* Sleeps ms milliseconds in all (a signal does not cut it short). */
static inline void sleep_ms(unsigned ms) {
    struct timespec t = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
}

#endif
