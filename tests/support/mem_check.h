/* What the tests read back of memory: the process's resident set size and a
 * content pattern that shows a block handed out twice, overwritten or
 * purged while live. Header-only (static inline), with no Criterion and no
 * allocation, so the Criterion tests, their re-executed children, the
 * ThreadSanitizer programs (tests/tsan/) and the soak test (tests/soak/)
 * can all use it. */
#ifndef LULL_TEST_MEM_CHECK_H
#define LULL_TEST_MEM_CHECK_H

#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <unistd.h>

/* A 64-bit mixer (MurmurHash3's finalizer). */
static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    x ^= x >> 33;
    return x;
}

/* xorshift64*: one state per thread, never 0. */
static inline uint64_t rng_next(uint64_t *s) {
    uint64_t x = *s;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545F4914F6CDD1DULL;
}

/* The start of a /proc file (up to size - 1 bytes), NUL-terminated, read
 * with one read() and no allocation; false if it cannot be read. */
__attribute__((unused)) static bool read_proc(const char *path, char *buf, size_t size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    ssize_t n = read(fd, buf, size - 1);
    close(fd);
    if (n <= 0) return false;
    buf[n] = 0;
    return true;
}

#if defined(__SANITIZE_ADDRESS__)
#define LULL_TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define LULL_TEST_ASAN 1
#endif
#endif

#ifdef LULL_TEST_ASAN
/* Resident bytes of AddressSanitizer's shadow (x86-64: [0x7fff8000,
 * 0x10007fff8000)). Every access to memory lull mapped reads its shadow,
 * which nothing writes (lull's blocks are not ASan's): a kernel with a
 * shared zero page maps that, one without (a PVM guest booted with
 * pvm_no_zero_page=1) a page of RSS for every 32 KiB of new addresses
 * touched, which the tests' RSS figures must not count as lull's:
 * test_fault_injection's 30 rounds of a 20 MiB huge block at new
 * addresses grew RSS by 77 MiB there. Under ASan only, whose malloc
 * the stdio here uses. */
__attribute__((unused)) static size_t asan_shadow_rss_bytes(void) {
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    char line[256];
    unsigned long lo = 0, hi = 0, kib;
    size_t total = 0;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%lx-%lx ", &lo, &hi) == 2) continue;
        if (sscanf(line, "Rss: %lu kB", &kib) == 1 && lo >= 0x7fff8000UL && hi <= 0x10007fff8000UL)
            total += (size_t)kib << 10;
    }
    fclose(f);
    return total;
}
#endif

/* Resident set size of this process in bytes, from /proc/self/statm read
 * without stdio (no allocation: lull may be the malloc being measured),
 * less AddressSanitizer's shadow in an ASan build; 0 if it cannot be
 * read. */
__attribute__((unused)) static size_t rss_bytes(void) {
    char buf[128];
    unsigned long size, res;
    if (!read_proc("/proc/self/statm", buf, sizeof buf) || sscanf(buf, "%lu %lu", &size, &res) != 2)
        return 0;
    size_t rss = (size_t)res * (size_t)sysconf(_SC_PAGESIZE);
#ifdef LULL_TEST_ASAN
    size_t shadow = asan_shadow_rss_bytes();
    rss = shadow < rss ? rss - shadow : 0;
#endif
    return rss;
}

/* Address space of this process in bytes (the size field of
 * /proc/self/statm, what RLIMIT_AS bounds), read without stdio: no
 * allocation, also under the limit being tested; 0 if it cannot be read. */
__attribute__((unused)) static size_t vm_bytes(void) {
    char buf[128];
    unsigned long size;
    if (!read_proc("/proc/self/statm", buf, sizeof buf) || sscanf(buf, "%lu", &size) != 1) return 0;
    return (size_t)size * (size_t)sysconf(_SC_PAGESIZE);
}

/* The content pattern of a block: the first 256 bytes, one byte in every
 * 4 KiB page and the last byte, each derived from the block's address, a
 * seed and the offset. Every page is written, so a purge of a live block is
 * seen, and it is cheap enough for multi-MiB blocks under TSan. */
static inline uint8_t pat_byte(const void *p, uint64_t seed, size_t off) {
    return (uint8_t)mix64((uintptr_t)p ^ seed ^ (off * 0x9E3779B97F4A7C15ULL));
}

__attribute__((unused)) static void pat_fill(void *p, size_t size, uint64_t seed) {
    uint8_t *b = p;
    size_t head = size < 256 ? size : 256;
    for (size_t i = 0; i < head; i++)
        b[i] = pat_byte(p, seed, i);
    for (size_t off = 4096; off < size; off += 4096)
        b[off] = pat_byte(p, seed, off);
    if (size) b[size - 1] = pat_byte(p, seed, size - 1);
}

/* The offset of the first byte of the pattern that differs, SIZE_MAX if
 * none does. */
__attribute__((unused)) static size_t pat_first_bad(const void *p, size_t size, uint64_t seed) {
    const uint8_t *b = p;
    size_t head = size < 256 ? size : 256;
    for (size_t i = 0; i < head; i++)
        if (b[i] != pat_byte(p, seed, i)) return i;
    for (size_t off = 4096; off < size; off += 4096)
        if (b[off] != pat_byte(p, seed, off)) return off;
    if (size && b[size - 1] != pat_byte(p, seed, size - 1)) return size - 1;
    return SIZE_MAX;
}

__attribute__((unused)) static bool pat_check(const void *p, size_t size, uint64_t seed) {
    return pat_first_bad(p, size, seed) == SIZE_MAX;
}

#endif
