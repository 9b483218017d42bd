/* glibc's __libc_* names of the malloc family, which glibc 2.36 exports
 * (GLIBC_2.2.5) but declares in no header, and the calls that code written
 * for glibc makes with them: an old malloc hook's wrapper allocates with
 * __libc_malloc, a runtime or profiler frees with __libc_free what the
 * program's malloc gave it. Each block made by one family is freed (or
 * grown) by the other, so both families must be one allocator's: a block
 * freed by the allocator that did not make it aborts the process (glibc's
 * "free(): invalid pointer", lull's "not allocated by lull").
 *
 * Header-only: for tests/programs/libc_names.c (run under LD_PRELOAD) and
 * tests/test_glibc_libc_names.c (linked with liblull.a). */
#ifndef LULL_TEST_LIBC_NAMES_H
#define LULL_TEST_LIBC_NAMES_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

void *__libc_malloc(size_t size);
void __libc_free(void *p);
void *__libc_calloc(size_t count, size_t size);
void *__libc_realloc(void *p, size_t size);
void *__libc_memalign(size_t alignment, size_t size);
void *__libc_valloc(size_t size);
void *__libc_pvalloc(size_t size);

/* the names, for a list of symbols to look up */
#define LIBC_NAMES                                                                                 \
    "__libc_malloc", "__libc_free", "__libc_calloc", "__libc_realloc", "__libc_memalign",          \
        "__libc_valloc", "__libc_pvalloc"

static inline int libc_names_all_bytes(const char *p, int value, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i] != (char)value) return 0;
    return 1;
}

/* Every __libc_* call, each block crossing to the other family once.
 * Returns NULL, or what was wrong with a block (an abort is the other way
 * it fails). Sizes: small blocks, and a realloc to 1 MiB (a large block,
 * a copy or a move in either allocator). */
static inline const char *libc_names_mix(void) {
    const size_t big = (size_t)1 << 20;
    size_t page = (size_t)sysconf(_SC_PAGESIZE);

    char *a = malloc(100);
    if (!a) return "malloc(100) failed";
    memset(a, 1, 100);
    __libc_free(a);

    char *b = __libc_malloc(100);
    if (!b) return "__libc_malloc(100) failed";
    memset(b, 2, 100);
    free(b);

    char *c = __libc_calloc(10, 10);
    if (!c || !libc_names_all_bytes(c, 0, 100)) return "__libc_calloc(10, 10): not zeroed";
    free(c);

    char *d = malloc(64);
    if (!d) return "malloc(64) failed";
    memset(d, 3, 64);
    d = __libc_realloc(d, big);
    if (!d || !libc_names_all_bytes(d, 3, 64)) return "__libc_realloc(malloc's block): lost";
    free(d);

    char *e = __libc_malloc(64);
    if (!e) return "__libc_malloc(64) failed";
    memset(e, 4, 64);
    e = realloc(e, big);
    if (!e || !libc_names_all_bytes(e, 4, 64)) return "realloc(__libc_malloc's block): lost";
    __libc_free(e);

    char *f = __libc_memalign(256, 1000);
    if (!f || (uintptr_t)f % 256) return "__libc_memalign(256, 1000): not aligned";
    memset(f, 5, 1000);
    free(f);

    char *g = __libc_valloc(100);
    if (!g || (uintptr_t)g % page) return "__libc_valloc(100): not page-aligned";
    memset(g, 6, 100);
    free(g);

    char *h = __libc_pvalloc(100); /* a whole page */
    if (!h || (uintptr_t)h % page) return "__libc_pvalloc(100): not page-aligned";
    memset(h, 7, page);
    free(h);
    return NULL;
}

#endif
