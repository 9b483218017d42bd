/* Lets Criterion start under ThreadSanitizer (compiled to nothing otherwise).
 *
 * Why it cannot start: Criterion 2.4.1 (Debian 12) creates its "inheritable
 * arena" with BoxFort's bxf_arena_init(), which picks a random 16 MiB-aligned
 * address in [0x2000_0000_0000, 0x6000_0000_0000) (base 0x200000000000 +
 * (rand_r() & 0x3fffff) << 24), checks with mincore() that the 128 KiB there
 * are unmapped, and gives up after 10 tries: "criterion: Could not initialize
 * inheritable arena: Resource temporarily unavailable" (the errno is a stale
 * EAGAIN), then abort(). Under TSan that whole window is TSan's own - shadow
 * memory, meta memory and gaps it maps PROT_NONE so that nothing lands there -
 * except [0x5500_0000_0000, 0x5680_0000_0000), its range for PIE binaries:
 * 1.5 TiB of 64, so 10 tries fail most of the time (Criterion issue #274).
 * Neither ASLR (setarch -R), mmap_rnd_bits, --jobs 1 nor any Criterion or
 * TSAN_OPTIONS option changes that window.
 *
 * The fix: the only caller of rand_r() in libcriterion.so is that function
 * (checked with objdump), and libcriterion.so calls it through the PLT, so a
 * rand_r() defined in the test executable takes its place. This one keeps
 * the pseudo-random sequence of the seed but lands every try in
 * [0x5660_0000_0000, 0x5680_0000_0000): inside TSan's application range and
 * above where the kernel puts a PIE binary and its brk heap (at most
 * 0x5555_5555_4000 + 2^vm.mmap_rnd_bits pages = 0x5655_5555_4000 with the
 * default 28 bits), so neither the parent nor a test's sandbox child, which
 * maps the arena at the same address with MAP_FIXED, meets its own binary
 * there. BoxFort still checks every page with mincore() before mapping. */
#ifndef __has_feature
#define __has_feature(x) 0
#endif
#if defined(__SANITIZE_THREAD__) || __has_feature(thread_sanitizer)

#define BXF_MMAP_BASE 0x200000000000ull /* BoxFort's mmap_base (64-bit) */
#define BXF_MMAP_SHIFT 24               /* its mmap_off: 16 MiB steps */
#define WINDOW_LO 0x566000000000ull
#define WINDOW_HI 0x568000000000ull /* TSan: end of the PIE range */

int rand_r(unsigned int *seed);

int rand_r(unsigned int *seed) {
    /* the LCG of the C standard's example rand(), 15 bits per step */
    unsigned int next = *seed, r = 0;
    for (int i = 0; i < 2; i++) {
        next = next * 1103515245u + 12345u;
        r = (r << 15) ^ ((next >> 16) & 0x7fff);
    }
    *seed = next;
    const unsigned int lo = (unsigned int)((WINDOW_LO - BXF_MMAP_BASE) >> BXF_MMAP_SHIFT);
    const unsigned int slots = (unsigned int)((WINDOW_HI - WINDOW_LO) >> BXF_MMAP_SHIFT);
    return (int)(lo + r % slots); /* a 128 KiB arena fits in any 16 MiB slot */
}

#endif
