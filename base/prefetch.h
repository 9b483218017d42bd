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
    /* prefetchw, with no CPUID test: AMD's x86-64 processors all have it,
     * and Intel's before Broadwell, whose CPUID does not list it, run it
     * as a no-op (why 64-bit Windows 8.1 could require the instruction) */
    __asm__ volatile("prefetchw %0" : : "m"(*(const char *)p));
#else
    __builtin_prefetch(p, 1, 3);
#endif
}

#endif
