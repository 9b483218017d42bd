/* lull_prefetch_for_write(p): ask for p's cache line in a state this core
 * may write (x86-64's prefetchw), before a read of it that a write of it
 * follows. A block another core wrote last (a remote free's block, a
 * message's blocks) read first comes in shared, and the write that follows
 * waits for a second round trip that takes it away from that core; asked
 * for writing, one round trip does both. No fault: p may be any address. */
#ifndef LULL_PREFETCH_H
#define LULL_PREFETCH_H

static inline void lull_prefetch_for_write(const void *p) {
#if defined(__x86_64__)
    /* prefetchw: every x86-64 processor executes it (those older ones whose
     * CPUID does not list it as a no-op), so no test at run time */
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

#endif
